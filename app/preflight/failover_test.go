package preflight_test

import (
	"context"
	"testing"
	"time"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestFailoverReadiness runs check on a primary with a streaming standby.
// From PostgreSQL 17 on it names what the slot needs to survive a
// failover: a failover slot, synchronized_standby_slots naming the
// standby's physical slot, and the standby's own settings; before 17 it
// advises on_slot_loss: recreate. On the standby itself it is a problem.
func TestFailoverReadiness(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg := testenv.Postgres(t)
	standby, err := pg.StartStandby(ctx, servers.StandbyOptions{Name: "replica1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	f := fixtureOn(t, pg.URL(), goodSchema)
	f.setUp(t) // a slot without failover
	if err := standby.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	if pg.Major() < 17 {
		findings := run(t, f.cfg)
		w := want(t, findings, preflight.CheckFailover, preflight.Warning, "cannot carry logical slots to standbys")
		wantFix(t, w, "set on_slot_loss: recreate, so that walcount recreates the slot and reconciles every counter by itself")
		cfg := f.cfg
		cfg.OnSlotLoss = config.SlotLossRecreate
		want(t, run(t, cfg), preflight.CheckFailover, preflight.OK, "on_slot_loss is recreate")
	} else {
		findings := run(t, f.cfg)
		want(t, findings, preflight.CheckFailover, preflight.Warning, "is not a failover slot")
		w := want(t, findings, preflight.CheckFailover, preflight.Warning, `does not name the physical slot(s) replica1`)
		wantFix(t, w, "ALTER SYSTEM SET synchronized_standby_slots = 'replica1'; SELECT pg_reload_conf();")
		want(t, findings, preflight.CheckFailover, preflight.OK, "sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name = 'replica1'")

		if err := pg.SetSynchronizedStandbySlots(ctx, standby.StandbySlot()); err != nil {
			t.Fatal(err)
		}
		f.exec(t, "SELECT pg_drop_replication_slot($1)", f.cfg.Slot)
		f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)", f.cfg.Slot)
		findings = run(t, f.cfg)
		want(t, findings, preflight.CheckFailover, preflight.OK, "synchronized_standby_slots names every standby's physical slot")
		for _, fd := range findings {
			if fd.Check == preflight.CheckFailover && fd.Severity != preflight.OK {
				t.Errorf("with a failover slot and synchronized_standby_slots set: %s %s", fd.Severity, fd.Message)
			}
		}
	}

	onStandby := f.cfg
	onStandby.DatabaseURL = standby.URL()
	p := want(t, run(t, onStandby), preflight.CheckFailover, preflight.Problem, "the server is a standby")
	wantFix(t, p, "point --database-url at the primary, or list every host with target_session_attrs=read-write")
}
