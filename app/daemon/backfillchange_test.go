package daemon

import (
	"context"
	"fmt"
	"testing"

	"github.com/walcount/walcount/state"
)

// TestBackfillResumedAfterADefinitionChange: a backfill stopped part-way
// through a counter resumes after the counter's definition changed (a
// filter added while walcount was down). The keys it measured before the
// stop were measured with the old definition, so the counter starts over:
// it must not be recorded as backfilled with the new definition on the
// strength of a measurement made with the old one.
func TestBackfillResumedAfterADefinitionChange(t *testing.T) {
	t.Parallel()
	const counters = `
reconcile: {batch_size: 50, max_keys_per_second: 1000}
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count%s}
`
	e := newEnvWith(t, severalSchema, func(e *env) { e.cfg = e.loadConfig(testSettings + fmt.Sprintf(counters, "")) })
	ctx := context.Background()
	// Rows older than the slot: only the backfill counts them. A third of
	// the likes are soft-deleted, so the new filter changes every post.
	if _, err := e.db.Exec(ctx, `INSERT INTO posts (id) SELECT g FROM generate_series(31, 2000) g;
INSERT INTO likes (post_id, deleted_at) SELECT 1 + g % 2000, CASE WHEN g % 3 = 0 THEN now() END FROM generate_series(1, 12000) g`); err != nil {
		t.Fatal(err)
	}
	r := e.start()
	waitFor(t, "backfill under way", func() bool {
		c := r.d.ReconcileStatus().Current
		return c != nil && c.Kind == state.KindBackfill && c.KeysChecked >= 300
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var status string
	var checked int64
	if err := e.db.QueryRow(ctx, `SELECT status, keys_checked FROM walcount.reconcile_runs WHERE kind = 'backfill' ORDER BY id DESC LIMIT 1`).Scan(&status, &checked); err != nil {
		t.Fatal(err)
	}
	if status != state.StatusRunning || checked == 0 || checked >= 2000 {
		t.Fatalf("after stop: backfill %s with %d keys checked; want one interrupted part-way", status, checked)
	}

	e.cfg = e.loadConfig(testSettings + fmt.Sprintf(counters, ", where: {deleted_at: null}"))
	r = e.start()
	defer func() {
		if err := r.stop(t); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "every backfill done", func() bool {
		var n int
		err := e.db.QueryRow(ctx, `SELECT count(*) FROM walcount.reconcile_runs WHERE status NOT IN ('done', 'failed')`).Scan(&n)
		st := r.d.ReconcileStatus()
		return err == nil && n == 0 && st.Current == nil && st.Last != nil
	})
	e.waitCaughtUp(catchUp)
	e.assertNone("posts after the resumed backfill", `
SELECT p.id::text, p.likes_count::text, count(l.id)::text
FROM posts p LEFT JOIN likes l ON l.post_id = p.id AND l.deleted_at IS NULL
GROUP BY p.id, p.likes_count HAVING p.likes_count <> count(l.id) ORDER BY p.id LIMIT 20`)
}
