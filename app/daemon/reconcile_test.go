package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// waitRun waits for the reconciler to be idle and returns the last run.
func waitRun(t testing.TB, r *running, id int64) reconcile.RunInfo {
	t.Helper()
	var last reconcile.RunInfo
	if !wait.Until(3*time.Minute, 50*time.Millisecond, func() bool {
		st := r.d.ReconcileStatus()
		if st.Current == nil && st.Last != nil && (id == 0 || st.Last.ID == id) {
			last = *st.Last
			return true
		}
		if id == 0 {
			return false
		}
		// A run the reconciler queued at once after it (a dirty mark's
		// repair) may start between two polls, so that run id is never
		// the last with none current: its record says it ended.
		view, ok, err := r.d.rec.Lookup(context.Background(), id)
		if err != nil || !ok || (view.Status != state.StatusDone && view.Status != state.StatusFailed) {
			return false
		}
		last = view.RunInfo
		return true
	}) {
		t.Fatalf("reconciliation %d did not finish", id)
	}
	return last
}

// startRun starts an on-demand run once the reconciler is idle (the
// backfill of a new daemon runs first).
func startRun(t testing.TB, r *running, req reconcile.Request) reconcile.RunInfo {
	t.Helper()
	var run reconcile.RunInfo
	var err error
	if !wait.Until(3*time.Minute, 50*time.Millisecond, func() bool {
		run, err = r.d.rec.Start(context.Background(), req)
		return err == nil
	}) {
		t.Fatalf("start reconciliation: %v", err)
	}
	return run
}

func (e *env) count(t testing.TB, post int64) (cached, truth int64) {
	t.Helper()
	err := e.db.QueryRow(context.Background(), `SELECT likes_count, (SELECT count(*) FROM likes WHERE post_id = $1) FROM posts WHERE id = $1`, post).Scan(&cached, &truth)
	if err != nil {
		t.Fatal(err)
	}
	return cached, truth
}

// TestReconcileCorrectsExactlyTheDrift injects drift into quiet keys and
// into the hot key while a workload keeps writing, and checks that
// exactly the drifted keys are corrected.
func TestReconcileCorrectsExactlyTheDrift(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	waitRun(t, r, 0) // the automatic backfill of the new counter

	// Drift: posts 7 and 8 are quiet (the workload never touches
	// post 40+); post 1 is the workload's hot post.
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 5 WHERE id IN (47, 48)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = likes_count - 3 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	w := newWorkload(e.db)
	w.posts = 40
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); w.run(loadCtx, 4, 100000) }()

	before := float64(counterValue(r.d.m.ReconcileCorrections.WithLabelValues("post_likes")))
	run := startRun(t, r, reconcile.Request{BatchSize: 10})
	got := waitRun(t, r, run.ID)
	stopLoad()
	<-loadDone
	w.report(t)
	if got.Status != state.StatusDone {
		t.Fatalf("run = %+v", got)
	}
	corrections := float64(counterValue(r.d.m.ReconcileCorrections.WithLabelValues("post_likes"))) - before
	if got.Corrected != 3 || corrections != 3 || got.Drifted != 3 {
		t.Fatalf("corrected %d keys (metric %v), drifted %d; want exactly the 3 drifted keys; drift: %+v", got.Corrected, corrections, got.Drifted, got.Drift)
	}
	if got.KeysChecked != 50 {
		t.Errorf("keys checked = %d, want 50", got.KeysChecked)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	waitRun(t, r, 0)
	newWorkload(e.db).run(ctx, 2, 100)
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 2 WHERE id = 9`); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	run := startRun(t, r, reconcile.Request{DryRun: true})
	got := waitRun(t, r, run.ID)
	if got.Status != state.StatusDone || got.Drifted != 1 || got.Corrected != 0 {
		t.Fatalf("dry run = %+v", got)
	}
	if len(got.Drift) != 1 || got.Drift[0].Key != "9" || got.Drift[0].Correction != -2 {
		t.Fatalf("reported drift = %+v, want post 9 off by +2", got.Drift)
	}
	e.waitCaughtUp(catchUp)
	if cached, truth := e.count(t, 9); cached != truth+2 {
		t.Fatalf("dry run changed post 9: cached %d, true %d", cached, truth)
	}
	// A real run then fixes it.
	run = startRun(t, r, reconcile.Request{})
	if got := waitRun(t, r, run.ID); got.Corrected != 1 {
		t.Fatalf("real run = %+v", got)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileResumesAfterRestart stops the daemon in the middle of a
// run; the next daemon finishes it from where it stopped.
func TestReconcileResumesAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `INSERT INTO posts (id) SELECT g FROM generate_series(51, 3000) g`); err != nil {
		t.Fatal(err)
	}
	r := e.start()
	waitRun(t, r, 0)
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = 1 WHERE id IN (100, 2900)`); err != nil {
		t.Fatal(err)
	}
	// Paced so the stop lands mid-run: unpaced, 3000 keys can all be
	// checked between seeing 500 and the stop taking effect (it did on
	// a fast CI machine).
	rate := 1000
	run := startRun(t, r, reconcile.Request{BatchSize: 50, MaxKeysPerSecond: &rate})
	waitFor(t, "run under way", func() bool {
		c := r.d.ReconcileStatus().Current
		return c != nil && c.KeysChecked >= 500
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var checked int64
	var status string
	if err := e.db.QueryRow(ctx, `SELECT status, keys_checked FROM walcount.reconcile_runs WHERE id = $1`, run.ID).Scan(&status, &checked); err != nil {
		t.Fatal(err)
	}
	// Progress is saved a range at a time: what the table holds trails
	// the 500 seen by up to a batch.
	if status != state.StatusRunning || checked < 500-50 || checked >= 3000 {
		t.Fatalf("after stop: status %s, keys checked %d; want an interrupted run", status, checked)
	}
	r2 := e.start()
	got := waitRun(t, r2, run.ID)
	if got.Status != state.StatusDone || got.KeysChecked != 3000 || got.Corrected != 2 {
		t.Fatalf("resumed run = %+v; want 3000 keys checked once and 2 corrections", got)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestBackfillWhileWriting adds walcount to a table that already has
// rows; the automatic backfill makes the counts exact while writes go on.
func TestBackfillWhileWriting(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// Rows written before walcount followed the table: a new slot starts
	// after them, so only the backfill can count them.
	if _, err := e.db.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + (g % 50) FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Run(ctx, conn, setup.Options{Config: e.cfg, RecreateSlot: true}); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	w := newWorkload(e.db)
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); w.run(loadCtx, 3, 100000) }()
	r := e.start()
	// The recreated slot also marked the counter dirty: its repair runs
	// before or after the backfill, and whichever comes first corrects
	// the posts. Wait until both are done (the last run seen is either).
	var backfill, repair string
	var corrected int64
	if !wait.Until(3*time.Minute, 50*time.Millisecond, func() bool {
		err = e.db.QueryRow(ctx, `SELECT coalesce(string_agg(status, ',') FILTER (WHERE kind = 'backfill'), ''),
  coalesce(string_agg(status, ',') FILTER (WHERE kind = 'dirty'), ''), coalesce(sum(corrected), 0)
FROM walcount.reconcile_runs`).Scan(&backfill, &repair, &corrected)
		return err == nil && backfill == state.StatusDone && repair == state.StatusDone && r.d.ReconcileStatus().Current == nil
	}) {
		t.Fatalf("after 3 minutes: backfill %q, repair %q (%v)", backfill, repair, err)
	}
	stopLoad()
	<-loadDone
	w.report(t)
	if corrected != 50 {
		t.Fatalf("the backfill and the repair corrected %d posts; want each of the 50 corrected once", corrected)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// counterValue reads a Prometheus counter; counters hold whole numbers here.
func counterValue(c prometheus.Counter) int64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return int64(m.GetCounter().GetValue())
}
