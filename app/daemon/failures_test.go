package daemon

import (
	"context"
	"fmt"
	"testing"

	"github.com/walcount/walcount/internal/metrics"
)

// TestRedisOutageCountsFailures kills Redis while the app writes and the
// daemon streams. A Redis outage never reaches
// walcount_flush_errors_total, which counts failed PostgreSQL flushes, so
// it must show in walcount_session_failures_total: one failure while
// streaming, then failures at start until Redis answers again. Meanwhile
// walcount_streaming is 0, and it is 1 again once Redis is back; the counts
// end exact.
func TestRedisOutageCountsFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.serve()
	failures := func(sc scraped, stage string) float64 {
		return sc.must(t, "walcount_session_failures_total", metrics.LabelStage, stage)
	}
	poll(t, "the daemon to stream", func() (bool, string) {
		v := s.scrape(t).must(t, "walcount_streaming")
		return v == 1, fmt.Sprintf("walcount_streaming %v", v)
	})
	before := s.scrape(t)
	for _, stage := range metrics.Stages {
		if v := failures(before, stage); v != 0 {
			t.Fatalf("walcount_session_failures_total{stage=%q} = %v before any failure, want 0", stage, v)
		}
	}
	if v := before.must(t, "walcount_waiting_for_slot"); v != 0 {
		t.Errorf("walcount_waiting_for_slot = %v for the only walcount, want 0", v)
	}

	// The load runs until Redis is back and the daemon streams again, so
	// that the outage happens under it however fast this machine is.
	loadCtx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	w := newWorkload(e.db)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); w.run(loadCtx, 4, 1<<30) }()
	txns0 := before.must(t, "walcount_transactions_total")
	poll(t, "the load to reach the daemon", func() (bool, string) {
		v := s.scrape(t).must(t, "walcount_transactions_total")
		return v > txns0+10, fmt.Sprintf("walcount_transactions_total %v (from %v)", v, txns0)
	})

	if err := e.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	poll(t, "failures while streaming and at start to be counted", func() (bool, string) {
		during := s.scrape(t)
		streaming, atStart := failures(during, metrics.StageStreaming), failures(during, metrics.StageStart)
		return streaming >= 1 && atStart >= 1 && during.must(t, "walcount_streaming") == 0,
			fmt.Sprintf("failures streaming %v, start %v; walcount_streaming %v", streaming, atStart, during.must(t, "walcount_streaming"))
	})

	if err := e.redis.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	poll(t, "the daemon to stream again after Redis is back", func() (bool, string) {
		v := s.scrape(t).must(t, "walcount_streaming")
		return v == 1, fmt.Sprintf("walcount_streaming %v", v)
	})
	stopLoad()
	<-loadDone
	w.report(t)

	after := s.scrape(t)
	total := failures(after, metrics.StageStart) + failures(after, metrics.StageStreaming)
	if st := s.status(t); total < 2 || !st.Streaming {
		t.Errorf("after the outage: %v failures counted, /status streaming %v; want at least 2 and streaming", total, st.Streaming)
	}
	t.Logf("Redis outage: %v session failures while streaming, %v at start", failures(after, metrics.StageStreaming), failures(after, metrics.StageStart))
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}
