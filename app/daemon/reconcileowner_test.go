package daemon

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// dbRun reads a run's record.
func (e *env) dbRun(t testing.TB, id int64) (status string, checked, corrected int64, owner string) {
	t.Helper()
	err := e.db.QueryRow(context.Background(), `SELECT status, keys_checked, corrected, coalesce(owner, '') FROM walcount.reconcile_runs WHERE id = $1`, id).
		Scan(&status, &checked, &corrected, &owner)
	if err != nil {
		t.Fatal(err)
	}
	return status, checked, corrected, owner
}

// waitDBRun waits until the run's record says it is done.
func (e *env) waitDBRun(t testing.TB, id int64) (checked, corrected int64) {
	t.Helper()
	var status string
	waitFor(t, fmt.Sprintf("run %d done", id), func() bool {
		status, checked, corrected, _ = e.dbRun(t, id)
		return status == state.StatusDone || status == state.StatusFailed
	})
	if status != state.StatusDone {
		t.Fatalf("run %d ended %s", id, status)
	}
	return checked, corrected
}

// TestReconcileSentToTheWaitingDaemon: with two daemons on one slot, a
// reconciliation asked of the one that waits is accepted and executed by
// the one that streams.
func TestReconcileSentToTheWaitingDaemon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a := e.start()
	waitFor(t, "first daemon streaming", func() bool { return a.d.Status(ctx).Streaming })
	b := e.start()
	waitFor(t, "second daemon waiting", func() bool { return b.d.Status(ctx).WaitingForSlot })
	waitRun(t, a, 0) // the backfill
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 5 WHERE id IN (3, 7)`); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, b, reconcile.Request{})
	checked, corrected := e.waitDBRun(t, run.ID)
	if checked != 50 || corrected != 2 {
		t.Fatalf("run asked of the waiting daemon: %d keys checked, %d corrected; want 50 and 2", checked, corrected)
	}
	if b.d.Status(ctx).Streaming {
		t.Fatal("the waiting daemon streams")
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	for _, r := range []*running{a, b} {
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReconcileTakenOverOnce: the streaming daemon stops in the middle of
// a run; the waiting one takes the slot and the run over and finishes it,
// one daemon at a time, and the record's figures are the corrections
// really applied.
func TestReconcileTakenOverOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `INSERT INTO posts (id) SELECT g FROM generate_series(51, 2000) g`); err != nil {
		t.Fatal(err)
	}
	a := e.start()
	waitRun(t, a, 0)
	b := e.start()
	waitFor(t, "second daemon waiting", func() bool { return b.d.Status(ctx).WaitingForSlot })
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = 9 WHERE id IN (20, 1500, 1990)`); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, a, reconcile.Request{BatchSize: 50})
	waitFor(t, "run under way on the first daemon", func() bool {
		c := a.d.ReconcileStatus().Current
		return c != nil && c.KeysChecked >= 300
	})
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second daemon streams", func() bool { return b.d.Status(ctx).Streaming })
	checked, corrected := e.waitDBRun(t, run.ID)
	if checked != 2000 || corrected != 3 {
		t.Fatalf("run taken over: %d keys checked, %d corrected; want 2000 and 3", checked, corrected)
	}
	if _, _, _, owner := e.dbRun(t, run.ID); owner == "" {
		t.Error("the finished run names no owner")
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCrashBetweenCorrectionAndFlush crashes walcount right after a
// reconciliation emitted its correction into the WAL and before a flush
// applied it: the restarted daemon applies it exactly once.
func TestCrashBetweenCorrectionAndFlush(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	fp := &failpoint.Set{}
	d := e.start(func(o *Options) { o.Failpoints = fp })
	waitRun(t, d, 0)
	newWorkload(e.db).run(ctx, 2, 100)
	e.waitCaughtUp(catchUp)
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 4 WHERE id = 11`); err != nil {
		t.Fatal(err)
	}
	fp.CrashAfter(failpoint.AfterCorrection, 1)
	startRun(t, d, reconcile.Request{})
	if err := d.wait(t, time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	d2 := e.start()
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d2.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileTakenOverAfterKill: a run held by a daemon that was killed
// (its lease still an hour away, as SIGKILL leaves it: no clean stop
// released it) is taken over by the next daemon as soon as it streams the
// slot, not when the lease expires, and corrects what it finds.
func TestReconcileTakenOverAfterKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	d := e.start()
	waitRun(t, d, 0) // the backfill
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 5 WHERE id IN (3, 7)`); err != nil {
		t.Fatal(err)
	}
	run, err := state.NewRuns(e.db, e.cfg.Slot).Create(ctx, state.KindManual, []string{"post_likes"}, false, 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `UPDATE walcount.reconcile_runs SET status = 'running', owner = 'killed-host/4242/1', lease_until = now() + interval '1 hour'
WHERE id = $1`, run.ID); err != nil {
		t.Fatal(err)
	}
	d = e.start()
	checked, corrected := e.waitDBRun(t, run.ID)
	if corrected != 2 || checked == 0 {
		t.Fatalf("run taken over: %d keys checked, %d corrected; want 2 corrected", checked, corrected)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestBackfillAfterUnfinishedRun: a counter added while a run is left
// unfinished (the daemon that queued it stopped first) is backfilled once
// that run is done, not at some later start: post_live_likes, added to a
// deployment that kept post_likes alone, counts the likes that predate it.
func TestBackfillAfterUnfinishedRun(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, severalSchema, func(e *env) { e.cfg = e.loadConfig(severalConfig) })
	ctx := context.Background()
	full := e.cfg
	e.cfg.Counters = full.Counters[:1] // post_likes alone
	d := e.start()
	waitRun(t, d, 0)
	e.exec("INSERT INTO likes (post_id) SELECT 1 + g % 30 FROM generate_series(1, 300) g")
	e.waitCaughtUp(catchUp)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	// A run the stopped daemon queued and never executed.
	run, err := state.NewRuns(e.db, e.cfg.Slot).Create(ctx, state.KindManual, []string{"post_likes"}, false, 0)
	if err != nil {
		t.Fatal(err)
	}

	e.cfg = full
	d = e.start()
	e.waitDBRun(t, run.ID)
	waitFor(t, "post_live_likes backfilled", func() bool {
		var off int64
		err := e.db.QueryRow(ctx, `SELECT count(*) FROM posts p
WHERE live_likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id AND l.deleted_at IS NULL)`).Scan(&off)
		return err == nil && off == 0
	})
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
