package daemon

import (
	"context"
	"sync"
	"testing"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/reconcile"
)

// viaKarmaOff selects the rows of walcount.via_user_karma that differ from
// what the posts and votes say (no row counts as zeros), as target,
// passes and total: the post's creator, whether it counts, the sum of its
// votes.
const viaKarmaOff = `
SELECT k::text, format('%s/%s/%s', coalesce(v.target, 0), coalesce(v.passes, 0), coalesce(v.total, 0)), format('%s/%s/%s', t.target, t.passes, t.total)
FROM (SELECT parent_key AS k FROM walcount.via_user_karma UNION SELECT id FROM posts UNION SELECT post_id FROM votes) keys
LEFT JOIN walcount.via_user_karma v ON v.parent_key = keys.k
CROSS JOIN LATERAL (SELECT coalesce((SELECT creator_id FROM posts WHERE id = k), 0) AS target,
  (SELECT count(*) FROM posts WHERE id = k AND NOT deleted AND NOT removed AND creator_id IS NOT NULL) AS passes,
  (SELECT coalesce(sum(score), 0) FROM votes WHERE post_id = k) AS total) t
WHERE (coalesce(v.target, 0), coalesce(v.passes, 0), coalesce(v.total, 0)) <> (t.target, t.passes, t.total)`

// viaGarbage counts the via rows that hold nothing: all zeros, of a
// parent that is gone, with no source row.
const viaGarbage = `
SELECT (SELECT count(*) FROM walcount.via_user_karma v WHERE v.target = 0 AND v.passes = 0 AND v.total = 0
          AND NOT EXISTS (SELECT 1 FROM posts p WHERE p.id = v.parent_key) AND NOT EXISTS (SELECT 1 FROM votes s WHERE s.post_id = v.parent_key))
     + (SELECT count(*) FROM walcount.via_community_comments v WHERE v.target = 0 AND v.passes = 0 AND v.total = 0
          AND NOT EXISTS (SELECT 1 FROM posts p WHERE p.id = v.parent_key) AND NOT EXISTS (SELECT 1 FROM comments s WHERE s.post_id = v.parent_key))`

// TestViaRowsOfDeletedParentsCollected: the via rows of deleted posts
// stay behind as rows of zeros, one per post ever deleted, until a
// collection deletes them. A collection is exact alongside the stream:
// a post re-created with the same key (and voted on) by a transaction
// that commits after the collection read its snapshot and before it
// committed keeps its votes (before, the aggregator took the via row's
// delete for the end of the row and dropped those deltas), and
// collections running all along a churn of posts deleted, re-created,
// re-keyed and voted on leave every via row and every total exact, with
// no row of zeros left behind and no drift for a reconciliation to find.
func TestViaRowsOfDeletedParentsCollected(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, throughSchema, func(e *env) { e.cfg = e.loadConfig(throughConfig) })
	fp := &failpoint.Set{}
	d := e.start(func(o *Options) { o.Failpoints = fp })
	ctx := context.Background()
	waitRun(t, d, 0) // the first start's backfill
	e.waitBothLevels()
	e.assertThroughExact("after the backfill")

	e.exec("DELETE FROM posts WHERE id BETWEEN 1 AND 20")
	e.waitBothLevels()
	var garbage int64
	if err := e.db.QueryRow(ctx, viaGarbage).Scan(&garbage); err != nil || garbage != 40 {
		t.Fatalf("via rows of the 20 deleted posts = %d (%v), want 40: one per post in each via table", garbage, err)
	}

	// Post 5 is created again, with votes, after the collection's
	// snapshot and before its commit.
	var once sync.Once
	disarm := fp.Arm(failpoint.ViaCollect, func() (err error) {
		once.Do(func() {
			e.inTransaction("INSERT INTO posts (id, creator_id, community_id) VALUES (5, 3, 2)",
				"INSERT INTO votes (post_id, score) VALUES (5, 1), (5, 1), (5, 1), (5, -1)",
				"INSERT INTO comments (post_id) VALUES (5), (5)")
		})
		return nil
	})
	n, err := d.d.CollectVia(ctx)
	disarm()
	// The votes' via table is collected first, post 5's row with it; the
	// comments' one after the hook, and post 5 is back by then.
	if err != nil || n != 39 {
		t.Fatalf("collection: %d rows (%v), want the 39 of the deleted posts", n, err)
	}
	e.waitBothLevels()
	e.assertNone("via rows", viaKarmaOff)
	e.assertThroughExact("after a collection raced by a post re-created")

	// Collections all along a churn of posts.
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		throughLoad(loadCtx, t, e, 3, 300)
	}()
	var collected int64
	for done := false; !done; {
		select {
		case <-loaded:
			done = true
		default:
		}
		n, err := d.d.CollectVia(ctx)
		if err != nil {
			t.Fatalf("collection under load: %v", err)
		}
		collected += n
	}
	e.waitBothLevels()
	n, err = d.d.CollectVia(ctx)
	if err != nil {
		t.Fatal(err)
	}
	collected += n
	e.waitBothLevels()
	t.Logf("%d via rows collected during and after the churn", collected)
	if err := e.db.QueryRow(ctx, viaGarbage).Scan(&garbage); err != nil || garbage != 0 {
		t.Errorf("%d via rows of zeros of deleted posts left (%v), want none", garbage, err)
	}
	e.assertNone("via rows after the churn", viaKarmaOff)
	e.assertThroughExact("after the churn")
	if got := counterValue(d.d.m.ViaRowsCollected.WithLabelValues("user_karma")) + counterValue(d.d.m.ViaRowsCollected.WithLabelValues("community_comments")); float64(got) != float64(39+collected) {
		t.Errorf("walcount_via_rows_collected_total = %v, want %d", got, 39+collected)
	}
	run := waitRun(t, d, startRun(t, d, reconcile.Request{}).ID)
	if run.Status != "done" || run.Drifted != 0 {
		t.Errorf("reconciliation after the churn: %+v, want done without drift", run)
	}
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
