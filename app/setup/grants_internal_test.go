package setup

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestMissingGrantsCreateMissing: the GRANTs setup prints for a role
// include INSERT on the columns a create_missing counter writes a created
// row with, and nothing more.
func TestMissingGrantsCreateMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	admin, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	role := fmt.Sprintf("grants_create_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if _, err := admin.Exec(ctx, appschema.SQL(appschema.Options{PostsColumns: "title text NOT NULL, body text", DefaultIdentity: true})+`
CREATE ROLE `+role+` LOGIN;
GRANT SELECT ON likes TO `+role+`;`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	c := counter.Default()
	c.CreateMissing, c.Defaults = true, map[string]string{"title": "untitled"}
	lookup := func(name string) (*counter.Table, error) {
		s, n := counter.SplitTable(name)
		return counter.ReadTable(ctx, conn, s, n)
	}
	got, err := missingGrants(ctx, conn, []counter.Counter{c}, lookup, role)
	if err != nil {
		t.Fatal(err)
	}
	want := `GRANT SELECT ("id", "likes_count"), UPDATE ("likes_count"), INSERT ("id", "likes_count", "title") ON "public"."posts" TO ` + role
	if strings.Join(got, "; ") != want {
		t.Errorf("grants = %q, want %q", got, want)
	}
}
