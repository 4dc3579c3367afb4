package daemon

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The aggregate row of a comment keeps the comment's own published time
// (a max whose key is the source's primary key: one row per key), and a
// count with create_missing creates the row. Counters of one target run in
// name order in the flush: the max runs before the row exists when its
// name sorts first, after the row was created when it sorts last.
const createdMaxSchema = `
CREATE TABLE comment (id bigserial PRIMARY KEY, published timestamptz NOT NULL DEFAULT clock_timestamp());
ALTER TABLE comment REPLICA IDENTITY FULL;
CREATE TABLE comment_aggregates (comment_id bigint PRIMARY KEY, rows bigint NOT NULL DEFAULT 0, published timestamptz);
`

const createdMaxTruth = `
SELECT c.id::text, format('%s/%s', a.rows, a.published), format('1/%s', c.published)
FROM comment c LEFT JOIN comment_aggregates a ON a.comment_id = c.id
WHERE a.comment_id IS NULL OR a.rows <> 1 OR a.published IS DISTINCT FROM c.published`

// TestExtremumOnCreatedRow: every new comment gets its aggregate row,
// created by the count, with the max set from the comment, in either name
// order; and no flush is reported as crossing a change of its target row,
// since none did but the flush's own creation of the row.
func TestExtremumOnCreatedRow(t *testing.T) {
	t.Parallel()
	for _, order := range []struct{ name, maxName, countName string }{
		{"max first", "comment_a_published", "comment_rows"},
		{"max last", "comment_published", "comment_a_rows"},
	} {
		t.Run(order.name, func(t *testing.T) {
			t.Parallel()
			cfg := testSettings + fmt.Sprintf(`
counters:
  - {name: %s, source: comment, key: id, target: comment_aggregates, target_key: comment_id, column: published, max: published}
  - {name: %s, source: comment, key: id, target: comment_aggregates, target_key: comment_id, column: rows, create_missing: true}
`, order.maxName, order.countName)
			e := newEnvWith(t, createdMaxSchema, func(e *env) { e.cfg = e.loadConfig(cfg) })
			core, logs := observer.New(zapcore.InfoLevel)
			d := e.start(func(o *Options) { o.Logger = zap.New(core) })
			if run := waitRun(t, d, 0); run.Status != "done" {
				t.Fatalf("backfill %+v, want done", run)
			}
			ctx := context.Background()
			for i := range 60 {
				if _, err := e.db.Exec(ctx, "INSERT INTO comment DEFAULT VALUES"); err != nil {
					t.Fatal(err)
				}
				if i%20 == 19 {
					e.waitCaughtUp(catchUp)
				}
			}
			e.waitCaughtUp(catchUp)
			e.waitCaughtUp(catchUp)
			e.assertNone("new comments", createdMaxTruth)
			for _, l := range logs.FilterMessageSnippet("a flush crossed").All() {
				t.Errorf("logged %q %v", l.Message, l.ContextMap())
			}
		})
	}
}

// TestCreatedRowInPieces: a big batch of new comments, applied in pieces.
// The count that creates the aggregate rows (comment_rows) runs in the
// first pieces, before the counters of the target that create no rows,
// whatever their names: a count that creates no rows and the max run in
// later ones, on rows an earlier piece created (with the max named to
// sort first, a drain in name order dropped its recomputes as missing
// rows). An earlier piece's inserts are not a change of the row a later
// piece's delta was counted for: no delta is taken back, and nothing is
// logged as crossing.
func TestCreatedRowInPieces(t *testing.T) {
	t.Parallel()
	for _, order := range []struct{ name, maxName string }{
		{"max first", "comment_apublished"},
		{"max last", "comment_zpublished"},
	} {
		t.Run(order.name, func(t *testing.T) {
			t.Parallel()
			cfg := testSettings + fmt.Sprintf(`
counters:
  - {name: comment_rows, source: comment, key: id, target: comment_aggregates, target_key: comment_id, column: rows, create_missing: true}
  - {name: %s, source: comment, key: id, target: comment_aggregates, target_key: comment_id, column: published, max: published}
  - {name: comment_self, source: comment, key: id, target: comment_aggregates, target_key: comment_id, column: self}
`, order.maxName)
			schema := createdMaxSchema + "ALTER TABLE comment_aggregates ADD COLUMN self bigint NOT NULL DEFAULT 0;"
			e := newEnvWith(t, schema, func(e *env) { e.cfg = e.loadConfig(cfg) })
			core, logs := observer.New(zapcore.InfoLevel)
			d := e.start(smallPieces, func(o *Options) { o.Logger = zap.New(core) })
			if run := waitRun(t, d, 0); run.Status != "done" {
				t.Fatalf("backfill %+v, want done", run)
			}
			e.exec("INSERT INTO comment (published) SELECT clock_timestamp() FROM generate_series(1, 6000)")
			e.waitCaughtUp(catchUp)
			e.waitNoCarried()
			e.waitCaughtUp(catchUp)
			for _, l := range logs.FilterMessageSnippet("a flush crossed").All() {
				t.Errorf("logged %q %v", l.Message, l.ContextMap())
			}
			if got := len(logs.FilterMessage("flushed a big batch in pieces").All()); got == 0 {
				t.Errorf("the batch was not applied in pieces")
			}
			e.assertNone("a big batch of new comments", `
SELECT c.id::text, format('%s/%s/%s', a.rows, a.self, a.published), format('1/1/%s', c.published)
FROM comment c LEFT JOIN comment_aggregates a ON a.comment_id = c.id
WHERE a.comment_id IS NULL OR a.rows <> 1 OR a.self <> 1 OR a.published IS DISTINCT FROM c.published`)
		})
	}
}
