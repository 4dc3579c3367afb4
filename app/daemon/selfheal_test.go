package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// waitClean waits until a repair ran, no dirty mark is left and W passed
// everything committed, so that the counters must be exact.
func (e *env) waitClean(t testing.TB, within time.Duration) {
	t.Helper()
	var marks []state.Dirty
	var err error
	if !wait.Until(within, 100*time.Millisecond, func() bool {
		var repaired int
		_ = e.db.QueryRow(context.Background(), `SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty' AND status = 'done'`).Scan(&repaired)
		marks, err = state.ListDirty(context.Background(), e.db, e.cfg.Slot)
		return err == nil && len(marks) == 0 && repaired > 0
	}) {
		t.Fatalf("dirty marks left after %s: %+v (%v)", within, marks, err)
	}
	e.waitCaughtUp(catchUp)
}

// TestReplicaIdentityLostAndRestored drops the replica identity that
// carries post_id while likes and unlikes stream in, keeps deleting while
// it is missing, then restores it: walcount keeps running, marks the
// counter dirty, and once the identity is back repairs it by itself.
func TestReplicaIdentityLostAndRestored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.start()
	ctx := context.Background()
	waitRun(t, d, 0)
	w := newWorkload(e.db)
	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx, 3, 300) })
	w.waitCommitted(t, 50)
	e.exec("ALTER TABLE likes REPLICA IDENTITY DEFAULT")
	for i := 0; i < 20; i++ {
		e.exec("DELETE FROM likes WHERE id = (SELECT min(id) FROM likes)")
	}
	waitFor(t, "the counter marked dirty and degraded", func() bool {
		st := d.d.Status(ctx)
		return len(st.Dirty) > 0 && len(st.Degraded) == 1
	})
	if !d.d.Status(ctx).Streaming {
		t.Fatal("the daemon stopped streaming when the identity was lost")
	}
	e.exec("ALTER TABLE likes REPLICA IDENTITY FULL")
	wg.Wait()
	w.report(t)
	newWorkload(e.db).run(ctx, 2, 50)
	start := time.Now()
	e.waitClean(t, 2*time.Minute)
	t.Logf("repaired %s after the identity came back and the load ended", time.Since(start).Round(time.Millisecond))
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestSlotAdvancedPastCheckpoint advances the slot by hand over likes that
// were never counted, while walcount is stopped: the next start sees the
// slot past W, marks every counter dirty and repairs it.
func TestSlotAdvancedPastCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	d := e.start()
	waitRun(t, d, 0)
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "slot released", func() bool {
		var active bool
		err := e.db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&active)
		return err == nil && !active
	})
	e.exec("INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 200) g")
	e.exec("SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", e.cfg.Slot)
	d2 := e.start()
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitClean(t, 2*time.Minute)
	e.assertExact()
	if err := d2.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestLostSlotRecreated: with on_slot_loss: recreate, a slot lost while
// walcount was stopped is recreated, every counter marked dirty and
// reconciled, and the counts end exact with no command typed.
func TestLostSlotRecreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.OnSlotLoss = config.SlotLossRecreate
	ctx := context.Background()
	first := e.start()
	newWorkload(e.db).run(ctx, 2, 30)
	e.waitCaughtUp(catchUp)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	e.restartWith(map[string]string{"max_slot_wal_keep_size": "1MB"})
	loseSlot(t, e) // writes likes while the slot is lost
	start := time.Now()
	d := e.start()
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitClean(t, 2*time.Minute)
	t.Logf("healed %s after the start", time.Since(start).Round(time.Millisecond))
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestSlotDroppedStops: with on_slot_loss: stop (the default), a slot
// dropped under a running daemon stops it with the fix, instead of
// retrying forever.
func TestSlotDroppedStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	d := e.start()
	e.waitCaughtUp(catchUp)
	waitFor(t, "the slot dropped", func() bool {
		_, _ = e.db.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", e.cfg.Slot)
		_, err := e.db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", e.cfg.Slot)
		return err == nil
	})
	err := d.wait(t, time.Minute)
	if !errors.Is(err, cdc.ErrSlotMissing) && !errors.Is(err, slot.ErrSlotNotFound) {
		t.Fatalf("Run = %v, want an error saying the slot is missing", err)
	}
	if !strings.Contains(err.Error(), "walcount setup") {
		t.Errorf("the error does not say what to do: %v", err)
	}
}

// TestDegradedAcrossSessions: the identity comes back while no like
// arrives, and the session restarts (the replication connection is
// killed) before the next one: the new session must still see the counter
// become keepable at its next change, and repair it.
func TestDegradedAcrossSessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.start()
	ctx := context.Background()
	waitRun(t, d, 0)
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	e.exec("ALTER TABLE likes REPLICA IDENTITY DEFAULT")
	e.exec("DELETE FROM likes WHERE id = (SELECT min(id) FROM likes)")
	waitFor(t, "the counter degraded", func() bool { return len(d.d.Status(ctx).Degraded) == 1 })
	e.exec("ALTER TABLE likes REPLICA IDENTITY FULL")
	started := d.d.Status(ctx).SessionStart
	e.exec("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot)
	waitFor(t, "a new session", func() bool {
		st := d.d.Status(ctx)
		return st.Streaming && st.SessionStart != nil && started != nil && st.SessionStart.After(*started)
	})
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitClean(t, 2*time.Minute)
	if got := d.d.Status(ctx).Degraded; len(got) != 0 {
		t.Errorf("still degraded after the repair: %v", got)
	}
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
