package daemon

import (
	"context"
	"testing"

	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// TestReconcileInterruptedAtStart stops the daemon (SIGTERM's context
// cancellation) while a run it just claimed waits for the first count of
// its target rows, blocked by a lock another connection holds on the
// table: the run is not recorded failed ("context canceled", for good, as
// before), and the next daemon resumes it to its end.
func TestReconcileInterruptedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.start()
	waitRun(t, r, 0) // the backfill

	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE posts IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, r, reconcile.Request{})
	poll(t, "the run to wait for the lock on posts", func() (bool, string) {
		var waiting int
		err := e.db.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE NOT l.granted AND c.relname = 'posts'`).Scan(&waiting)
		return err == nil && waiting > 0, "no session waits for posts"
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var status, msg string
	if err := e.db.QueryRow(ctx, "SELECT status, coalesce(error, '') FROM walcount.reconcile_runs WHERE id = $1", run.ID).Scan(&status, &msg); err != nil {
		t.Fatal(err)
	}
	if status == state.StatusFailed {
		t.Fatalf("run %d interrupted by the stop is recorded %s: %s; want it left to resume", run.ID, status, msg)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r2 := e.start()
	got := waitRun(t, r2, run.ID)
	if got.Status != state.StatusDone || got.KeysChecked != 50 {
		t.Fatalf("resumed run = %s, %d keys checked (%s); want done with the 50 posts", got.Status, got.KeysChecked, got.Error)
	}
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
}
