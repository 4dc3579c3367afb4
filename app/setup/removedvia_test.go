package setup_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestRemovedViaCounterTable: the via table of a counter through a parent
// that leaves the configuration is dropped by the next setup (printed by
// --print-sql for the owner), and leaves the publication; added back, the
// counter gets a new one, a row of zeros for every parent, which its
// backfill counts (the state of the generated counters was forgotten:
// TestForgetRemovedCounters).
func TestRemovedViaCounterTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	f.exec(t, `ALTER TABLE posts ADD COLUMN author_id bigint; ALTER TABLE users ADD COLUMN karma bigint NOT NULL DEFAULT 0;
INSERT INTO users (id) SELECT g FROM generate_series(1, 3) g;
INSERT INTO posts (id, author_id) SELECT g, 1 + g % 3 FROM generate_series(1, 9) g;`)
	karma := counter.Counter{Name: "author_likes", Source: "public.likes", Key: "post_id", Target: "public.users", TargetKey: "id", Column: "karma",
		Through: &counter.Through{Table: "public.posts", Key: "id", Column: "author_id"}}
	with := counter.ExpandThrough([]counter.Counter{likes, karma})
	const via = "walcount.via_author_likes"

	f.run(t, f.opts(with...))
	if !slices.Contains(f.published(t), via) {
		t.Fatalf("published %v, want %s", f.published(t), via)
	}

	opt := f.opts(likes)
	var out bytes.Buffer
	opt.PrintSQL, opt.Out = true, &out
	if _, err := setup.Run(context.Background(), f.conn, opt); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `DROP TABLE IF EXISTS "walcount"."via_author_likes";`) {
		t.Errorf("--print-sql after the via counter left the config does not drop its via table:\n%s", out.String())
	}

	res := f.run(t, f.opts(likes))
	if got := f.query(t, "SELECT coalesce(to_regclass($1)::text, '')", via); got != "" {
		t.Errorf("%s is still there after setup without its counter", via)
	}
	if !slices.Equal(res.DroppedVia, []string{via}) {
		t.Errorf("DroppedVia = %v, want [%s]", res.DroppedVia, via)
	}
	if slices.Contains(f.published(t), via) {
		t.Errorf("published %v after its counter left", f.published(t))
	}
	if res := f.run(t, f.opts(likes)); len(res.DroppedVia) != 0 {
		t.Errorf("a second setup dropped %v", res.DroppedVia)
	}

	f.run(t, f.opts(with...))
	if n := f.query(t, "SELECT count(*)::text FROM "+via); n != "9" {
		t.Errorf("the via table made again holds %s rows, want one per post (9)", n)
	}
	if !slices.Contains(f.published(t), via) {
		t.Errorf("published %v, want %s again", f.published(t), via)
	}
}
