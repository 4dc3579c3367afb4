package daemon

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// This file tests create_missing for max and min counters, and the target
// rows a full reconciliation of any create_missing counter creates for
// keys whose source rows have no row (issue 35 §4).

// createExtremumSchema: post_stats has rows for posts 1 to 5 only (with
// nothing counted in them), a NOT NULL label without a default, and
// comments on posts 1 to 40 before walcount starts. The app's churn
// (extremumOp) writes to posts 1 to 30 only, so posts 31 to 40 get a row
// from nothing but the backfill.
const createExtremumSchema = `
CREATE TABLE post_stats (post_id bigint PRIMARY KEY, newest timestamptz, low_score integer,
  comments bigint NOT NULL DEFAULT 0, label text NOT NULL);
INSERT INTO post_stats (post_id, label) SELECT g, 'app' FROM generate_series(1, 5) g;
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint, created_at timestamptz,
  score integer, price numeric(10,2), deleted boolean NOT NULL DEFAULT false);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id, created_at);
CREATE INDEX ON comments (post_id, score);
INSERT INTO comments (post_id, created_at, score, deleted)
SELECT 1 + g % 40, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute 7.25 seconds',
       CASE WHEN g % 7 <> 0 THEN g % 50 - 10 END, g % 9 = 0
FROM generate_series(1, 600) g;
`

const createExtremumConfig = testSettings + `
counters:
  - {name: stat_newest, source: comments, key: post_id, target: post_stats, target_key: post_id, column: newest,
     max: created_at, where: {deleted: false}, create_missing: {defaults: {label: walcount}}}
  - {name: stat_low, source: comments, key: post_id, target: post_stats, target_key: post_id, column: low_score,
     min: score, create_missing: {defaults: {label: walcount}}}
  - {name: stat_comments, source: comments, key: post_id, target: post_stats, target_key: post_id, column: comments,
     create_missing: {defaults: {label: walcount}}}
`

// createExtremumTruth lists the posts whose row differs from their
// comments, and those with comments that a counter would give a row
// (a value for the max or the min, or a count) and that have none.
const createExtremumTruth = `
SELECT coalesce(a.post_id, c.post_id)::text, format('%s/%s/%s', a.newest, a.low_score, a.comments), format('%s/%s/%s', c.n, c.l, c.c)
FROM post_stats a FULL JOIN (
  SELECT post_id, max(created_at) FILTER (WHERE NOT deleted) AS n, min(score) AS l, count(*) AS c
  FROM comments WHERE post_id IS NOT NULL GROUP BY post_id) c ON c.post_id = a.post_id
WHERE a.post_id IS NULL OR (a.newest, a.low_score, a.comments) IS DISTINCT FROM (c.n, c.l, coalesce(c.c, 0))`

// TestCreateMissingExtremum: max and min counters that create their
// target rows, beside a count that does too. The backfill creates the
// rows of the posts that had comments before walcount and no row, while
// the app comments on posts without rows, deletes and edits the current
// extremum and moves comments; a crash right after a flush's commit; then
// the app deletes rows walcount created (keeping their comments) and
// writes wrong values into others, and a full reconciliation creates the
// rows again, with their true values, and corrects the others. Every post ends exact, with no dirty
// mark left.
func TestCreateMissingExtremum(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, createExtremumSchema, func(e *env) { e.cfg = e.loadConfig(createExtremumConfig) })
	ctx := context.Background()
	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, 5)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	w := newWorkload(e.db)
	w.posts = 30
	var wg sync.WaitGroup
	wg.Go(func() { w.runOps(ctx, t, 3, 200, extremumOp) })
	if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	disarm()
	d = e.start()
	wg.Wait()
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	e.waitCaughtUp(catchUp)
	e.waitNoDirty(t)
	e.assertNone("after the backfill, a crash and churn on missing rows", createExtremumTruth)
	var backfilled int
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM post_stats WHERE post_id > 30 AND label = 'walcount'").Scan(&backfilled); err != nil {
		t.Fatal(err)
	}
	if backfilled != 10 {
		t.Fatalf("%d rows created for the 10 posts that only the backfill counts, want 10", backfilled)
	}

	// The app deletes rows walcount created, keeping their comments, and
	// writes wrong values into two others: a full reconciliation creates
	// the rows again and corrects the values.
	e.exec("DELETE FROM post_stats WHERE post_id IN (33, 34, 35)")
	e.exec("UPDATE post_stats SET newest = '2000-01-01', low_score = 10000, comments = 7 WHERE post_id IN (36, 37)")
	e.waitCaughtUp(catchUp)
	run := startRun(t, d, reconcile.Request{})
	got := waitRun(t, d, run.ID)
	// Each created row holds its true max, min and count from the seed
	// on (nothing to correct), each wrong row is corrected in its three
	// columns (2 × 3).
	if got.Status != "done" || got.Corrected != 6 {
		t.Fatalf("reconciliation %+v, want done with 6 corrections", got)
	}
	e.waitCaughtUp(catchUp)
	e.waitNoDirty(t)
	e.assertNone("after a reconciliation that created rows again", createExtremumTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// waitNoDirty waits until no dirty mark is left: their repairs have run.
func (e *env) waitNoDirty(t testing.TB) {
	t.Helper()
	var marks []state.Dirty
	var err error
	if !wait.Until(2*time.Minute, 100*time.Millisecond, func() bool {
		marks, err = state.ListDirty(context.Background(), e.db, e.cfg.Slot)
		return err == nil && len(marks) == 0
	}) {
		t.Fatalf("dirty marks left: %+v (%v)", marks, err)
	}
	e.waitCaughtUp(catchUp)
}
