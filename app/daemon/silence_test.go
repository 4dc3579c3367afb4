package daemon

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/metrics"
)

// walsenderPID returns the pid of the walsender that holds the slot.
func (e *env) walsenderPID(t testing.TB) int {
	t.Helper()
	var pid int
	poll(t, "a walsender to hold the slot", func() (bool, string) {
		err := e.db.QueryRow(context.Background(),
			`SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, e.cfg.Slot).Scan(&pid)
		return err == nil && pid != 0, fmt.Sprintf("active_pid %d, err %v", pid, err)
	})
	return pid
}

// TestSilentStreamIsAbandoned stops the walsender with SIGSTOP, as a
// half-open connection (a NAT or load balancer that dropped its state)
// looks to walcount: the socket stays open and nothing arrives, not even a
// keepalive. Past stream_timeout the stream is declared dead: the session
// fails and is counted, walcount_stream_timeouts_total counts it, /readyz
// fails with the reason and /status does not take the stopped walsender,
// which still holds the slot, for another walcount. After SIGCONT the
// daemon streams again and every count ends exact.
func TestSilentStreamIsAbandoned(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, schema, func(e *env) { e.cfg.StreamTimeout = 3 * time.Second })
	s := e.serve()
	s.waitReadyz(t, http.StatusOK, "the daemon to be ready", nil)
	newWorkload(e.db).run(context.Background(), 2, 30)
	e.waitCaughtUp(catchUp)

	pid := e.walsenderPID(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT walsender %d: %v", pid, err)
			}
		}
	}
	t.Cleanup(resume)
	stopped := time.Now()
	// The app keeps writing while the stream is silent.
	newWorkload(e.db).run(context.Background(), 2, 30)

	body := s.waitReadyz(t, http.StatusServiceUnavailable, "/readyz to fail while the walsender is stopped", func(b string) bool {
		return strings.Contains(b, "not streaming")
	})
	t.Logf("/readyz %s after SIGSTOP: %s", time.Since(stopped).Round(time.Millisecond), strings.TrimSpace(body))
	poll(t, "the silent stream to be counted", func() (bool, string) {
		sc := s.scrape(t)
		timeouts := sc.must(t, "walcount_stream_timeouts_total")
		failures := sc.must(t, "walcount_session_failures_total", metrics.LabelStage, metrics.StageStreaming)
		return timeouts >= 1 && failures >= 1, fmt.Sprintf("walcount_stream_timeouts_total %v, session failures while streaming %v", timeouts, failures)
	})
	// The stopped walsender still holds the slot: that is not another
	// walcount, and the wait must not pass for a standby's.
	poll(t, "a later session to meet the held slot", func() (bool, string) {
		st := s.status(t)
		return st.Failures >= 2, fmt.Sprintf("failures %d, last error %q", st.Failures, st.LastError)
	})
	st := s.status(t)
	if st.WaitingForSlot || s.scrape(t).must(t, "walcount_waiting_for_slot") != 0 {
		t.Errorf("/status waiting_for_slot %v while the slot is held by walcount's own stopped walsender; want false", st.WaitingForSlot)
	}
	if !strings.Contains(st.LastError, "silent") {
		t.Errorf("/status last_error %q does not say the stream went silent", st.LastError)
	}
	t.Logf("/status while stopped: failures %d, last error %q", st.Failures, st.LastError)

	resume()
	s.waitReadyz(t, http.StatusOK, "/readyz to pass after SIGCONT", nil)
	e.moreLikesThenExact()
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}
