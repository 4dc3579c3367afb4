package setup_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestGeneratedColumnInFullIdentity: a source with REPLICA IDENTITY FULL
// and a STORED generated column, as a vote table with a derived weight
// has. From PostgreSQL 18 on, PostgreSQL refuses the app's UPDATE and
// DELETE of such a table once it is in a publication that does not
// publish generated columns (SQLSTATE 42P10: "Replica identity must not
// contain unpublished generated columns"); setup created exactly that
// publication. Now, on every version:
//   - after setup the app updates and deletes the table;
//   - setup run again finds the publication as it wants it;
//   - on 18, a publication a DBA set to publish_generated_columns = none
//     is a problem for check, naming the fix, and setup puts it right;
//   - on 18, a source whose FULL identity holds a VIRTUAL generated
//     column, which no publication can carry, is refused by check and by
//     setup --fix-replica-identity, and never published.
func TestGeneratedColumnInFullIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, testenv.Database(t))
	f.exec(t, `CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, score int NOT NULL DEFAULT 1,
  weight int GENERATED ALWAYS AS (score * 2) STORED);
ALTER TABLE votes REPLICA IDENTITY FULL;
INSERT INTO posts (id) SELECT g FROM generate_series(1, 3) g;
INSERT INTO votes (post_id) SELECT 1 + g % 3 FROM generate_series(1, 30) g`)
	cfg := config.Default()
	cfg.Counters = []counter.Counter{{Name: "post_votes", Source: "votes", Key: "post_id", Target: "posts", TargetKey: "id", Column: "likes_count"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	opts := func() setup.Options {
		o := f.opts(cfg.Counters...)
		o.FixReplicaIdentity = false
		return o
	}
	f.run(t, opts())
	major, _ := strconv.Atoi(f.query(t, "SELECT current_setting('server_version_num')"))
	major /= 10000

	// The app's own statements.
	appWrites := func(when string) {
		t.Helper()
		for _, sql := range []string{"UPDATE votes SET score = score + 1 WHERE post_id = 1", "DELETE FROM votes WHERE id = (SELECT min(id) FROM votes)"} {
			if _, err := f.conn.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: the app's %q: %v", when, sql, err)
			}
		}
	}
	appWrites("after setup")

	printed := func() string {
		t.Helper()
		var out bytes.Buffer
		o := opts()
		o.PrintSQL, o.Out = true, &out
		if _, err := setup.Run(ctx, f.conn, o); err != nil {
			t.Fatalf("setup --print-sql: %v", err)
		}
		return out.String()
	}
	if out := printed(); !strings.Contains(out, "already holds exactly what walcount needs") {
		t.Fatalf("setup again would change the publication it made:\n%s", out)
	}
	if major < 18 {
		return
	}

	// 18: a DBA's publication that leaves generated columns out.
	f.exec(t, "ALTER PUBLICATION walcount SET (publish_generated_columns = none)")
	if _, err := f.conn.Exec(ctx, "UPDATE votes SET score = 3"); err == nil || !strings.Contains(err.Error(), "42P10") {
		t.Fatalf("the app's UPDATE under a publication without generated columns: %v, want PostgreSQL's 42P10 (the hazard this test is about)", err)
	}
	fs, err := preflight.Run(ctx, preflight.Options{Config: f.opts(cfg.Counters...).Config})
	if err != nil {
		t.Fatal(err)
	}
	var found *preflight.Finding
	for i := range fs {
		if fs[i].Check == preflight.CheckPublication && strings.Contains(fs[i].Message, "does not publish generated columns") {
			found = &fs[i]
		}
	}
	if found == nil || found.Severity != preflight.Problem || !strings.Contains(found.Message, "votes (weight)") ||
		!strings.Contains(found.Fix, "publish_generated_columns = stored") {
		t.Fatalf("check of a publication without generated columns: %+v\nall: %+v", found, fs)
	}
	if out := printed(); !strings.Contains(out, "publish_generated_columns = stored") {
		t.Fatalf("setup --print-sql does not put the publication right:\n%s", out)
	}
	f.run(t, opts())
	appWrites("after setup put the publication right")

	// 18: a VIRTUAL generated column under FULL can never be published.
	f.exec(t, `CREATE TABLE stars (id bigserial PRIMARY KEY, post_id bigint NOT NULL, n int NOT NULL DEFAULT 1,
  twice int GENERATED ALWAYS AS (n * 2) VIRTUAL);
INSERT INTO stars (post_id) VALUES (1), (2)`)
	virt := cfg
	virt.Counters = append(virt.Counters, counter.Counter{Name: "post_stars", Source: "stars", Key: "post_id", Target: "users", TargetKey: "id", Column: "followers_count"})
	if err := virt.Validate(); err != nil {
		t.Fatal(err)
	}
	o := f.opts(virt.Counters...) // asks to fix the identity
	if _, err := setup.Run(ctx, f.conn, o); err == nil || !strings.Contains(err.Error(), "VIRTUAL generated column") {
		t.Fatalf("setup --fix-replica-identity of a source with a VIRTUAL generated column: %v, want a refusal naming it", err)
	}
	f.exec(t, "ALTER TABLE stars REPLICA IDENTITY FULL") // as a DBA might
	o.FixReplicaIdentity = false
	if _, err := setup.Run(ctx, f.conn, o); err == nil || !strings.Contains(err.Error(), "VIRTUAL generated column twice") {
		t.Fatalf("setup of a FULL-identity source with a VIRTUAL generated column: %v, want a refusal naming it", err)
	}
	if got := f.query(t, "SELECT count(*)::text FROM pg_publication_tables WHERE pubname = 'walcount' AND tablename = 'stars'"); got != "0" {
		t.Fatalf("stars was published")
	}
	if _, err := f.conn.Exec(ctx, "UPDATE stars SET n = 2"); err != nil {
		t.Fatalf("the app's UPDATE of stars after the refused setup: %v", err)
	}
}
