package daemon

import (
	"context"
	"fmt"
	"testing"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// TestStandbyWaitIsShown stops the standby named in
// synchronized_standby_slots (PostgreSQL 17 and later) while the app
// writes: the primary holds walcount's walsender back until that standby
// confirms, so every counter freezes while ack_held_bytes stays small. The
// wait must be visible as such: /status names the slot and how long, and
// walcount_standby_wait_seconds grows, for an alert on the time. With the
// standby back, the wait ends and the counts are exact. Before 17 there is
// no such setting: walcount reports no wait and exports the metric at 0.
func TestStandbyWaitIsShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	if e.pg.Major() < 17 {
		s := e.serve()
		newWorkload(e.db).run(ctx, 2, 30)
		e.waitCaughtUp(catchUp)
		if st := s.status(t); st.StandbyWait != nil {
			t.Errorf("PostgreSQL %d: /status reports a standby wait: %+v", e.pg.Major(), *st.StandbyWait)
		}
		if v := s.scrape(t).must(t, "walcount_standby_wait_seconds"); v != 0 {
			t.Errorf("PostgreSQL %d: walcount_standby_wait_seconds = %v, want 0", e.pg.Major(), v)
		}
		t.Logf("PostgreSQL %d has no synchronized_standby_slots; checked that no wait is reported", e.pg.Major())
		return
	}
	standby, err := e.pg.StartStandby(ctx, servers.StandbyOptions{})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if err := e.pg.SetSynchronizedStandbySlots(ctx, standby.StandbySlot()); err != nil {
		t.Fatal(err)
	}
	e.db.Reset()
	s := e.serve()
	newWorkload(e.db).run(ctx, 2, 30)
	e.waitCaughtUp(catchUp)
	if st := s.status(t); st.StandbyWait != nil {
		t.Errorf("/status reports a standby wait with the standby up: %+v", *st.StandbyWait)
	}

	if err := standby.Stop(ctx, servers.StopImmediate); err != nil {
		t.Fatal(err)
	}
	newWorkload(e.db).run(ctx, 2, 30)
	poll(t, "/status and the metric to show the wait for the stopped standby", func() (bool, string) {
		st := s.status(t)
		w := st.StandbyWait
		if w == nil {
			return false, "no standby_wait in /status"
		}
		named := len(w.Slots) == 1 && w.Slots[0].Slot == standby.StandbySlot() && !w.Slots[0].Active
		secs := s.scrape(t).must(t, "walcount_standby_wait_seconds")
		return named && w.Seconds >= 2 && secs >= 2, fmt.Sprintf("standby_wait %+v, walcount_standby_wait_seconds %v", *w, secs)
	})

	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	poll(t, "the wait to end once the standby is back", func() (bool, string) {
		st := s.status(t)
		secs := s.scrape(t).must(t, "walcount_standby_wait_seconds")
		return st.StandbyWait == nil && secs == 0, fmt.Sprintf("standby_wait %v, metric %v", st.StandbyWait, secs)
	})
	e.moreLikesThenExact()
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}
