package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/state"
)

// TestReconcileFollowsTheRun runs two daemons of one slot with the real
// binary, one streaming and one waiting as a standby:
//   - walcount reconcile sent to the standby returns (it hung before: the
//     active daemon executed the run, which the standby never shows) and
//     says which walcount executes it;
//   - a client following a run on the active daemon across that daemon's
//     restart says the run goes on, and follows it to its end (exit 1
//     with "connection refused" before).
func TestReconcileFollowsTheRun(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 2000) g;")
	if code, out := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d\n%s", code, out)
	}
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	addrA, addrB := unusedAddr(t), unusedAddr(t)
	a := startWalcount(t, env, "run", "--http-addr", addrA)
	waitStreaming(t, a, addrA)
	b := startWalcount(t, env, "run", "--http-addr", addrB)
	waitStatus(t, addrB, `"waiting_for_slot": true`)
	poll(t, "the first start's backfill to end", func() (bool, string) {
		st, err := fetchReconcileStatus(context.Background(), addrA)
		if err != nil {
			return false, err.Error()
		}
		return st.Current == nil && st.Last != nil && st.Last.Kind == state.KindBackfill && st.Last.Status == state.StatusDone, fmt.Sprintf("%+v", st)
	})

	// Sent to the standby.
	code, out, _ := walcount(t, env, "reconcile", "--http-addr", addrB)
	if code != exitOK || !strings.Contains(out, "is executed by the walcount that streams from the slot") || !strings.Contains(out, " done: ") {
		t.Errorf("reconcile through the standby: exit %d, want 0 with the run followed to its end on the active daemon:\n%s", code, out)
	}

	// Followed across a restart of the daemon it was sent to: a slow run
	// (2000 keys at 100 keys/s), and the daemon stopped once it started.
	// It is sent to the daemon that streams now: on a busy machine a
	// session can fail and the standby take the slot over meanwhile.
	active, activeAddr, standby, standbyAddr := a, addrA, b, addrB
	if raw, err := fetchDaemonStatus(context.Background(), addrA); err != nil || !strings.Contains(string(raw), `"streaming": true`) {
		active, activeAddr, standby, standbyAddr = b, addrB, a, addrA
		waitStreaming(t, active, activeAddr)
	}
	follow := startWalcount(t, env, "reconcile", "--http-addr", activeAddr, "--max-keys-per-second", "100")
	poll(t, "the run to start", func() (bool, string) {
		return strings.Contains(follow.stdout.String(), "started"), follow.stdout.String()
	})
	if code := active.stop(); code != exitOK {
		t.Fatalf("the active run after SIGTERM: exit %d", code)
	}
	// The follower must see the daemon gone before it answers again: the
	// restart comes only after it said so: a restart quicker than its
	// 300 ms poll leaves it nothing to say.
	poll(t, "the follower to see the daemon gone", func() (bool, string) {
		return strings.Contains(follow.stdout.String(), "goes on"), follow.stdout.String()
	})
	waitStreaming(t, standby, standbyAddr) // the standby took the slot over
	restarted := startWalcount(t, env, "run", "--http-addr", activeAddr)
	code = follow.wait()
	got := follow.stdout.String()
	if code != exitOK || !strings.Contains(got, "goes on") || !strings.Contains(got, "answers again") || !strings.Contains(got, " done: 2000 keys checked") {
		t.Errorf("reconcile followed across a restart: exit %d, want 0, a word that the run goes on, and its end:\n%s", code, got)
	}
	if code := standby.stop(); code != exitOK {
		t.Errorf("the standby run after SIGTERM: exit %d", code)
	}
	if code := restarted.stop(); code != exitOK {
		t.Errorf("the restarted run after SIGTERM: exit %d", code)
	}
}

// waitStatus waits until the daemon at addr's /status holds want.
func waitStatus(t *testing.T, addr, want string) {
	t.Helper()
	poll(t, fmt.Sprintf("the daemon at %s to show %s", addr, want), func() (bool, string) {
		raw, err := fetchDaemonStatus(context.Background(), addr)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(raw), want), string(raw)
	})
}
