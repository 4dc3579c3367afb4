package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/buildinfo"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/slot"
)

// These tests look at walcount the way an operator does: over HTTP, in the
// logs and through its errors, against real servers that they stop, kill and
// starve. They assert no durations: every wait polls a condition under a
// generous deadline.

// observeWithin bounds every wait of these tests.
const observeWithin = 90 * time.Second

// testVersion is the version the served daemons export in
// walcount_build_info (with buildinfo.Get's other fields), as cmd/walcount
// does with its own build information.
const testVersion = "v0.0.0-observability-test"

// served is a daemon with its HTTP API, wired as `walcount run` wires it,
// and the log lines it wrote.
type served struct {
	*running
	m    *metrics.Metrics
	srv  *httpapi.Server
	base string
	logs *observer.ObservedLogs
}

// serve starts a daemon and an httpapi.Server on 127.0.0.1:0 in front of
// it. Logs are kept at debug level, and also go to the test log when
// WALCOUNT_TEST_LOG is set.
func (e *env) serve(opts ...daemonOpt) *served {
	e.t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	m := metrics.New()
	bi := buildinfo.Get()
	bi.Version = testVersion
	m.SetBuildInfo(bi)
	log := zap.New(zapcore.NewTee(core, testLogger(e.t).Core()))
	opts = append([]daemonOpt{func(o *Options) { o.Metrics, o.Logger = m, log }}, opts...)
	r := e.start(opts...)
	srv := httpapi.New(httpapi.Options{
		Addr:    "127.0.0.1:0",
		Metrics: m,
		Status:  func(ctx context.Context) any { return r.d.Status(ctx) },
		Ready:   r.d.Ready,
		Logger:  log,
	})
	if err := srv.Start(); err != nil {
		e.t.Fatalf("start http server: %v", err)
	}
	// Cleanups run last-in first-out: the server closes before the daemon
	// stops.
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			e.t.Errorf("close http server: %v", err)
		}
	})
	return &served{running: r, m: m, srv: srv, base: "http://" + srv.Addr(), logs: logs}
}

// get returns the status code and body of GET path.
func (s *served) get(t testing.TB, path string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// scrape reads /metrics with the Prometheus text parser.
func (s *served) scrape(t testing.TB) scraped {
	t.Helper()
	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return scraped(fams)
}

// status reads /status.
func (s *served) status(t testing.TB) Status {
	t.Helper()
	code, body := s.get(t, "/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status: %d\n%s", code, body)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("decode /status: %v\n%s", err, body)
	}
	return st
}

// waitReadyz polls /readyz until its status code is want and its body
// passes ok (nil accepts any body); it returns that body.
func (s *served) waitReadyz(t testing.TB, want int, what string, ok func(body string) bool) string {
	t.Helper()
	var code int
	var body string
	poll(t, what, func() (bool, string) {
		code, body = s.get(t, "/readyz")
		return code == want && (ok == nil || ok(body)), fmt.Sprintf("/readyz %d: %s", code, body)
	})
	return body
}

// count returns how many log lines have message msg at level lvl.
func (s *served) count(msg string, lvl zapcore.Level) int {
	return s.logs.FilterMessage(msg).FilterLevelExact(lvl).Len()
}

// poll calls cond until it reports true, failing the test with cond's last
// description after observeWithin.
func poll(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	if !wait.Until(observeWithin, 100*time.Millisecond, func() bool {
		var ok bool
		ok, last = cond()
		return ok
	}) {
		t.Fatalf("timed out after %s waiting for %s; last: %s", observeWithin, what, last)
	}
}

// scraped is one parsed scrape of /metrics.
type scraped map[string]*dto.MetricFamily

// value returns the value of the series of family name that carries the
// given label pairs (name, value, name, value...): a gauge's or counter's
// value, a histogram's sample count. false when there is no such series.
func (s scraped) value(name string, labels ...string) (float64, bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
series:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue series
			}
		}
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), true
		default:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// must returns value(name, labels...) and fails the test when the series is
// missing.
func (s scraped) must(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.value(name, labels...)
	if !ok {
		t.Fatalf("/metrics has no series %s%v", name, labels)
	}
	return v
}

// contractMetric is one metric of docs/design.md §6 (and the few the daemon adds),
// with its type and the labels each series must carry.
type contractMetric struct {
	name   string
	typ    dto.MetricType
	labels []string
}

var contract = []contractMetric{
	{"walcount_slot_lag_bytes", dto.MetricType_GAUGE, nil},
	{"walcount_slot_retained_wal_bytes", dto.MetricType_GAUGE, nil},
	{"walcount_slot_safe_wal_size_bytes", dto.MetricType_GAUGE, nil},
	{"walcount_slot_active", dto.MetricType_GAUGE, nil},
	{"walcount_slot_wal_status", dto.MetricType_GAUGE, []string{metrics.LabelStatus}},
	{"walcount_checkpoint_lsn", dto.MetricType_GAUGE, nil},
	{"walcount_received_lsn", dto.MetricType_GAUGE, nil},
	{"walcount_transactions_total", dto.MetricType_COUNTER, nil},
	{"walcount_changes_total", dto.MetricType_COUNTER, []string{metrics.LabelCounter, metrics.LabelOp}},
	{"walcount_flushes_total", dto.MetricType_COUNTER, nil},
	{"walcount_flush_duration_seconds", dto.MetricType_HISTOGRAM, nil},
	{"walcount_deltas_flushed_total", dto.MetricType_COUNTER, []string{metrics.LabelCounter}},
	{"walcount_deltas_dropped_total", dto.MetricType_COUNTER, []string{metrics.LabelCounter}},
	{"walcount_buffer_keys", dto.MetricType_GAUGE, nil},
	{"walcount_apply_lag_seconds", dto.MetricType_HISTOGRAM, nil},
	{"walcount_reconcile_corrections_total", dto.MetricType_COUNTER, []string{metrics.LabelCounter}},
	// Beyond the stages' metrics: what the daemon wiring exports.
	{"walcount_checkpoint_age_seconds", dto.MetricType_GAUGE, nil},
	{"walcount_queue_depth", dto.MetricType_GAUGE, nil},
	{"walcount_streaming", dto.MetricType_GAUGE, nil},
	{"walcount_build_info", dto.MetricType_GAUGE, []string{metrics.LabelVersion, metrics.LabelRevision, metrics.LabelModified, metrics.LabelGoVersion}},
	{"walcount_dirty", dto.MetricType_GAUGE, []string{metrics.LabelCounter}},
	{"walcount_slot_spill_bytes_total", dto.MetricType_COUNTER, nil},
	{"walcount_slot_spill_txns_total", dto.MetricType_COUNTER, nil},
	{"walcount_slot_stream_bytes_total", dto.MetricType_COUNTER, nil},
	{"walcount_slot_stream_txns_total", dto.MetricType_COUNTER, nil},
}

// checkContract fails the test for every contract metric that is missing,
// has another type or lacks a label.
func checkContract(t testing.TB, s scraped) {
	t.Helper()
	for _, c := range contract {
		f := s[c.name]
		if f == nil {
			t.Errorf("/metrics has no %s", c.name)
			continue
		}
		if f.GetType() != c.typ {
			t.Errorf("%s is a %s, want a %s", c.name, f.GetType(), c.typ)
		}
		if f.GetHelp() == "" {
			t.Errorf("%s has no help text", c.name)
		}
		if len(f.GetMetric()) == 0 {
			t.Errorf("%s has no series", c.name)
		}
		for _, m := range f.GetMetric() {
			have := map[string]bool{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = true
			}
			for _, l := range c.labels {
				if !have[l] {
					t.Errorf("a series of %s lacks label %q: %v", c.name, l, m.GetLabel())
				}
			}
		}
	}
}

// TestMetricsOverHTTP scrapes a running daemon's /metrics under a workload:
// every contract name is there, and the values agree with what happened.
func TestMetricsOverHTTP(t *testing.T) {
	t.Parallel()
	began := time.Now()
	e := newEnv(t)
	s := e.serve()
	s.waitReadyz(t, http.StatusOK, "the daemon to be ready", nil)

	ctx := context.Background()
	w := newWorkload(e.db)
	w.run(ctx, 4, 150)
	w.report(t)
	e.waitCaughtUp(catchUp)

	checkContract(t, s.scrape(t))

	const counter = "post_likes"
	var m scraped
	poll(t, "plausible metrics after catching up", func() (bool, string) {
		m = s.scrape(t)
		wLSN, err := e.checkpoint(ctx)
		if err != nil {
			return false, err.Error()
		}
		checkpoint := m.must(t, "walcount_checkpoint_lsn")
		received := m.must(t, "walcount_received_lsn")
		lag := m.must(t, "walcount_slot_lag_bytes")
		retained := m.must(t, "walcount_slot_retained_wal_bytes")
		why := fmt.Sprintf("checkpoint_lsn %v (W %s = %d), received_lsn %v, slot lag %v, retained %v",
			checkpoint, wLSN, uint64(wLSN), received, lag, retained)
		// The gauge follows W, which heartbeats keep moving; it can only
		// be behind PostgreSQL's copy, and never past what was received.
		return checkpoint > 0 && checkpoint <= float64(wLSN) && checkpoint <= received &&
			lag >= 0 && lag < 1<<20 && retained >= lag, why
	})

	expect := func(name string, ok func(float64) bool, want string, labels ...string) {
		t.Helper()
		if v := m.must(t, name, labels...); !ok(v) {
			t.Errorf("%s%v = %v, want %s", name, labels, v, want)
		}
	}
	positive := func(v float64) bool { return v > 0 }
	zero := func(v float64) bool { return v == 0 }
	one := func(v float64) bool { return v == 1 }
	expect("walcount_streaming", one, "1")
	expect("walcount_slot_active", one, "1 (the daemon streams from the slot)")
	expect("walcount_slot_wal_status", one, "1", metrics.LabelStatus, metrics.WALStatusReserved)
	for _, st := range []string{metrics.WALStatusExtended, metrics.WALStatusUnreserved, metrics.WALStatusLost} {
		expect("walcount_slot_wal_status", zero, "0", metrics.LabelStatus, st)
	}
	expect("walcount_slot_safe_wal_size_bytes", func(v float64) bool { return v == -1 },
		"-1: the test cluster has max_slot_wal_keep_size = -1")
	expect("walcount_transactions_total", positive, "> 0")
	for _, op := range []string{metrics.OpInsert, metrics.OpDelete, metrics.OpUpdate} {
		expect("walcount_changes_total", positive, "> 0 (the workload does it)", metrics.LabelCounter, counter, metrics.LabelOp, op)
	}
	expect("walcount_changes_total", zero, "0 (nothing was truncated)", metrics.LabelCounter, counter, metrics.LabelOp, metrics.OpTruncate)
	expect("walcount_flushes_total", positive, "> 0")
	expect("walcount_flush_duration_seconds", positive, "observations")
	expect("walcount_deltas_flushed_total", positive, "> 0", metrics.LabelCounter, counter)
	expect("walcount_deltas_dropped_total", zero, "0 (every post exists)", metrics.LabelCounter, counter)
	expect("walcount_apply_lag_seconds", positive, "observations")
	expect("walcount_reconcile_corrections_total", zero, "0", metrics.LabelCounter, counter)
	expect("walcount_buffer_keys", func(v float64) bool { return v >= 0 }, ">= 0")
	expect("walcount_queue_depth", func(v float64) bool { return v >= 0 && v <= cdc.DefaultQueueSize }, "within the queue's capacity")
	expect("walcount_checkpoint_age_seconds", func(v float64) bool { return v >= 0 && v <= time.Since(began).Seconds() },
		"between 0 and the test's age (W was created by the test)")
	expect("walcount_build_info", one, "1", metrics.LabelVersion, testVersion)
	if f := m["walcount_apply_lag_seconds"]; f != nil && len(f.GetMetric()) == 1 {
		if h := f.GetMetric()[0].GetHistogram(); h.GetSampleSum() < 0 {
			t.Errorf("walcount_apply_lag_seconds sum = %v, want >= 0", h.GetSampleSum())
		}
	}

	// /status agrees and holds what an operator looks for.
	st := s.status(t)
	if st.Slot != e.cfg.Slot || !st.Streaming || st.Checkpoint == "" || st.Received == "" ||
		st.LastFlush == nil || st.BufferKeys == nil || st.CheckpointAge == nil || st.SlotStatus == nil || st.Failures != 0 {
		t.Errorf("/status lacks what an operator needs: %+v", st)
	}
	if len(st.Counters) != 1 || st.Counters[0].Name != counter || st.Counters[0].Changes[metrics.OpInsert] <= 0 ||
		st.Counters[0].DeltasFlushed <= 0 || st.Counters[0].Target != "public.posts.likes_count" {
		t.Errorf("/status counters = %+v, want post_likes with its changes and flushed deltas", st.Counters)
	}

	// The stream's counters grow with the traffic.
	tx0 := m.must(t, "walcount_transactions_total")
	ins0 := m.must(t, "walcount_changes_total", metrics.LabelCounter, counter, metrics.LabelOp, metrics.OpInsert)
	flushed0 := m.must(t, "walcount_deltas_flushed_total", metrics.LabelCounter, counter)
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g"); err != nil {
		t.Fatal(err)
	}
	poll(t, "the counters to grow with new likes", func() (bool, string) {
		m := s.scrape(t)
		tx := m.must(t, "walcount_transactions_total")
		ins := m.must(t, "walcount_changes_total", metrics.LabelCounter, counter, metrics.LabelOp, metrics.OpInsert)
		flushed := m.must(t, "walcount_deltas_flushed_total", metrics.LabelCounter, counter)
		return tx > tx0 && ins >= ins0+100 && flushed > flushed0,
			fmt.Sprintf("transactions %v -> %v, inserts %v -> %v, deltas flushed %v -> %v", tx0, tx, ins0, ins, flushed0, flushed)
	})
	e.waitCaughtUp(catchUp)
	e.assertExact()

	// The logs: the unlimited max_slot_wal_keep_size is warned about once,
	// with the advice; each flush is one debug line with the slot field.
	poll(t, "the max_slot_wal_keep_size warning", func() (bool, string) {
		n := s.logs.FilterMessageSnippet("max_slot_wal_keep_size is -1").FilterLevelExact(zapcore.WarnLevel).Len()
		return n == 1, fmt.Sprintf("%d warnings", n)
	})
	for _, advice := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size", "walcount_slot_retained_wal_bytes", "walcount setup --recreate-slot"} {
		if s.logs.FilterMessageSnippet(advice).Len() == 0 {
			t.Errorf("the max_slot_wal_keep_size warning does not say %q", advice)
		}
	}
	flushLines := s.logs.FilterMessage("flushed").FilterLevelExact(zapcore.DebugLevel)
	if flushLines.Len() == 0 {
		t.Error("no debug line per flush")
	}
	for _, l := range flushLines.All() {
		if l.ContextMap()[logSlot] != e.cfg.Slot {
			t.Errorf("flush line without the slot field: %v", l.ContextMap())
			break
		}
	}
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestSlotLagRisesWhileStoppedAndFalls stops the daemon, writes, and starts
// another one that cannot flush yet because a test transaction holds a lock
// on a counted row: the scraped slot lag then shows what piled up while the
// daemon was stopped, /readyz fails on it and a warning is logged. Once the
// lock goes, the lag falls and /readyz passes again.
func TestSlotLagRisesWhileStoppedAndFalls(t *testing.T) {
	t.Parallel()
	const maxLag = 1 << 20
	e := newEnv(t)
	e.cfg.SlotSettings.MaxLagBytes = maxLag
	ctx := context.Background()

	first := e.serve()
	first.waitReadyz(t, http.StatusOK, "the first daemon to be ready", nil)
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	var lagRunning float64
	poll(t, "a small lag while running", func() (bool, string) {
		lagRunning = first.scrape(t).must(t, "walcount_slot_lag_bytes")
		return lagRunning < maxLag, fmt.Sprintf("lag %v", lagRunning)
	})
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}

	// While the daemon is stopped, a like and then a few MB of other
	// traffic pile up behind the slot.
	lagStopped := func() int64 {
		t.Helper()
		st, err := slot.ReadSlot(ctx, e.db, e.cfg.Slot)
		if err != nil {
			t.Fatal(err)
		}
		return st.LagBytes
	}
	lag0 := lagStopped()
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	before := currentLSN(t, e)
	if _, err := e.db.Exec(ctx, "INSERT INTO events (payload) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 4000) g"); err != nil {
		t.Fatal(err)
	}
	piled := int64(currentLSN(t, e) - before)
	lag1 := lagStopped()
	t.Logf("while stopped: slot lag %d -> %d bytes (%d bytes written after the like)", lag0, lag1, piled)
	if piled <= maxLag || lag1 < lag0+piled {
		t.Fatalf("lag while stopped went from %d to %d after %d bytes of WAL; want it to grow by them, past %d", lag0, lag1, piled, maxLag)
	}

	// The app holds a table lock on posts: the next daemon streams and
	// buffers, but every flush gives up on the lock (a row lock it would
	// skip, design rule 2), so nothing past the old W is acknowledged.
	lock, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE posts IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			if err := lock.Rollback(ctx); err != nil {
				t.Errorf("release the lock: %v", err)
			}
		}
	}
	second := e.serve()
	t.Cleanup(release) // before the daemon's cleanup, which flushes

	var lagBlocked float64
	poll(t, "the scraped lag to show the WAL written while stopped", func() (bool, string) {
		m := second.scrape(t)
		lagBlocked = m.must(t, "walcount_slot_lag_bytes")
		streaming := m.must(t, "walcount_streaming")
		return streaming == 1 && lagBlocked >= float64(piled), fmt.Sprintf("streaming %v, lag %v", streaming, lagBlocked)
	})
	if lagBlocked <= lagRunning {
		t.Errorf("scraped lag %v after the stop is not above %v before it", lagBlocked, lagRunning)
	}
	body := second.waitReadyz(t, http.StatusServiceUnavailable, "/readyz to fail on the lag alone", func(b string) bool {
		return strings.Contains(b, slot.ErrLagTooHigh.Error()) && !strings.Contains(b, "not streaming") &&
			!strings.Contains(b, "postgres:") && !strings.Contains(b, "redis:")
	})
	t.Logf("/readyz while behind: %s", strings.TrimSpace(body))
	poll(t, "the lag warning", func() (bool, string) {
		n := second.count("replication slot lag above the maximum; walcount is falling behind and the server keeps the WAL", zapcore.WarnLevel)
		return n >= 1, fmt.Sprintf("%d warnings", n)
	})
	// W does not move while the flushes give up: its age grows.
	var ageBlocked float64
	poll(t, "the checkpoint age to grow while W is stuck", func() (bool, string) {
		ageBlocked = second.scrape(t).must(t, "walcount_checkpoint_age_seconds")
		return ageBlocked >= 2, fmt.Sprintf("age %vs", ageBlocked)
	})
	if st := second.status(t); st.CheckpointAge == nil || *st.CheckpointAge < 2 || !st.Streaming {
		t.Errorf("/status while W is stuck: streaming %v, checkpoint age %v; want streaming, age >= 2s", st.Streaming, st.CheckpointAge)
	}

	release()
	poll(t, "the scraped lag to fall after the flush", func() (bool, string) {
		m := second.scrape(t)
		lag := m.must(t, "walcount_slot_lag_bytes")
		age := m.must(t, "walcount_checkpoint_age_seconds")
		return lag < maxLag && age < ageBlocked, fmt.Sprintf("lag %v, checkpoint age %vs", lag, age)
	})
	second.waitReadyz(t, http.StatusOK, "/readyz to pass once caught up", nil)
	poll(t, "the lag recovery line", func() (bool, string) {
		n := second.count("replication slot lag back under the maximum", zapcore.InfoLevel)
		return n == 1, fmt.Sprintf("%d lines", n)
	})
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := second.stop(t); err != nil {
		t.Fatal(err)
	}
}

func currentLSN(t testing.TB, e *env) cdc.LSN {
	t.Helper()
	var lsn cdc.LSN
	if err := e.db.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestReadyzFlipsAndFailureLogs stops PostgreSQL, then kills Redis, under a
// running daemon: /readyz fails with the reason and passes again after each
// restart, each outage is logged once at error level (later failures of the
// streak at debug) and ends with exactly one "recovered" line.
func TestReadyzFlipsAndFailureLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.serve()
	s.waitReadyz(t, http.StatusOK, "the daemon to be ready", nil)
	ctx := context.Background()

	const (
		failed    = "session failed; retrying"
		again     = "session failed again"
		recovered = "recovered: streaming again"
	)
	outage := func(name, reason string, stop, start func() error) {
		t.Helper()
		errs0, again0, rec0 := s.count(failed, zapcore.ErrorLevel), s.count(again, zapcore.DebugLevel), s.count(recovered, zapcore.InfoLevel)
		down := time.Now()
		if err := stop(); err != nil {
			t.Fatalf("stop %s: %v", name, err)
		}
		body := s.waitReadyz(t, http.StatusServiceUnavailable, "/readyz to fail without "+name, func(b string) bool {
			return strings.Contains(b, reason) && strings.Contains(b, "not streaming")
		})
		t.Logf("/readyz without %s: %s", name, strings.TrimSpace(body))
		// A streak of at least two failures: one error line, then debug.
		poll(t, "a second failed session without "+name, func() (bool, string) {
			n := s.count(again, zapcore.DebugLevel) - again0
			return n >= 1, fmt.Sprintf("%d debug lines", n)
		})
		if st := s.status(t); st.LastError == "" || st.Failures < 2 || st.Streaming {
			t.Errorf("/status without %s: last_error %q, failures %d, streaming %v", name, st.LastError, st.Failures, st.Streaming)
		}
		if err := start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		s.waitReadyz(t, http.StatusOK, "/readyz to pass after "+name+" is back", nil)
		streak := time.Since(down)
		errs := s.count(failed, zapcore.ErrorLevel) - errs0
		if limit := 1 + int(streak/FailureLogInterval); errs < 1 || errs > limit {
			t.Errorf("%d error lines for a %s outage; want 1 to %d (one per %s)", errs, streak.Round(time.Millisecond), limit, FailureLogInterval)
		}
		poll(t, "one recovered line after "+name+" is back", func() (bool, string) {
			n := s.count(recovered, zapcore.InfoLevel) - rec0
			return n == 1, fmt.Sprintf("%d lines", n)
		})
		lines := s.logs.FilterMessage(recovered).All()
		if n, _ := lines[len(lines)-1].ContextMap()["after_failures"].(int64); n < 2 {
			t.Errorf("recovered line says after_failures=%v, want >= 2", lines[len(lines)-1].ContextMap()["after_failures"])
		}
		t.Logf("%s outage: %s, %d error line(s), %d debug line(s)", name, streak.Round(time.Millisecond), errs, s.count(again, zapcore.DebugLevel)-again0)
	}

	// "immediate": a fast shutdown waits for the walsender, which waits
	// for walcount to confirm the shutdown checkpoint, which it never does
	// (it confirms W only).
	outage("postgres", "postgres:",
		func() error { return e.pg.Stop(ctx, "immediate") },
		func() error { return e.pg.Start(ctx) })
	outage("redis", "redis:",
		e.redis.Kill,
		func() error { return e.redis.Start(ctx) })

	e.moreLikesThenExact()
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestLostSlotStopsDaemon loses the slot while the daemon is stopped (a
// tiny max_slot_wal_keep_size, WAL switches and checkpoints) and starts it
// again: Run must return an error that wraps slot.ErrSlotLost and tells
// the operator what to do (design rule 12).
func TestLostSlotStopsDaemon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first := e.start()
	newWorkload(e.db).run(ctx, 2, 30)
	e.waitCaughtUp(catchUp)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}

	e.restartWith(map[string]string{"max_slot_wal_keep_size": "1MB"})
	loseSlot(t, e)

	s := e.serve()
	err := s.wait(t, observeWithin)
	if !errors.Is(err, slot.ErrSlotLost) {
		t.Fatalf("Run = %v, want an error wrapping slot.ErrSlotLost", err)
	}
	var lost *slot.SlotLostError
	if !errors.As(err, &lost) || lost.Slot != e.cfg.Slot {
		t.Errorf("Run = %v, want a *slot.SlotLostError for slot %q", err, e.cfg.Slot)
	}
	for _, todo := range []string{"walcount setup --recreate-slot", "on_slot_loss: recreate"} {
		if !strings.Contains(err.Error(), todo) {
			t.Errorf("error %q does not say %q", err, todo)
		}
	}
	t.Logf("Run returned: %v", err)
	if st := s.d.Status(ctx); !strings.Contains(st.LastError, "walcount setup --recreate-slot") {
		t.Errorf("/status last_error = %q, want the lost slot's error", st.LastError)
	}
	stops := s.count("stopping: the replication slot is lost", zapcore.ErrorLevel) +
		s.count("stopping: this error needs an operator", zapcore.ErrorLevel)
	if stops != 1 {
		t.Errorf("logged the stop %d times at error level, want once: %v", stops, s.logs.All())
	}
}

// loseSlot invalidates the stopped daemon's slot: each round moves the server
// to a new WAL segment and checkpoints, which removes the segments past
// max_slot_wal_keep_size.
func loseSlot(t testing.TB, e *env) {
	t.Helper()
	ctx := context.Background()
	for round := 1; ; round++ {
		for _, q := range []string{
			"INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g",
			"SELECT pg_switch_wal()",
			"CHECKPOINT",
		} {
			if _, err := e.db.Exec(ctx, q); err != nil {
				t.Fatalf("round %d: %s: %v", round, q, err)
			}
		}
		st, err := slot.ReadSlot(ctx, e.db, e.cfg.Slot)
		if err != nil {
			t.Fatal(err)
		}
		if st.Invalidated {
			t.Logf("slot lost after %d round(s): wal_status %q", round, st.WALStatus)
			return
		}
		if round == 20 {
			t.Fatalf("slot not lost after %d rounds: %+v", round, st)
		}
	}
}

// TestNoSecretsInOutputs runs the daemon with passwords in both URLs,
// through a PostgreSQL outage, and checks that neither password appears in
// /status, /readyz, /metrics, the logs or a configuration error.
func TestNoSecretsInOutputs(t *testing.T) {
	t.Parallel()
	const (
		pgSecret    = "s3cr3t-pw"
		redisSecret = "r3d1s-s3cr3t"
	)
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, "CREATE ROLE walcount_pw LOGIN REPLICATION SUPERUSER PASSWORD '"+pgSecret+"'"); err != nil {
		t.Fatal(err)
	}
	// The test cluster trusts local connections, so the password is sent
	// and ignored; Redis checks its own.
	if err := e.rdb().ConfigSet(ctx, "requirepass", redisSecret).Err(); err != nil {
		t.Fatal(err)
	}
	pgURL, err := url.Parse(e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	pgURL.User = url.UserPassword("walcount_pw", pgSecret)
	e.cfg.DatabaseURL = pgURL.String()
	e.cfg.RedisURL = "redis://:" + redisSecret + "@" + e.redis.Addr() + "/0"

	var outputs []string
	collect := func(s *served, when string) {
		for _, path := range []string{"/status", "/readyz", "/metrics", "/healthz"} {
			code, body := s.get(t, path)
			outputs = append(outputs, fmt.Sprintf("%s GET %s (%d):\n%s", when, path, code, body))
		}
	}

	s := e.serve()
	s.waitReadyz(t, http.StatusOK, "the daemon to be ready", nil)
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	collect(s, "running")

	// "immediate", for the reason TestReadyzFlipsAndFailureLogs gives.
	if err := e.pg.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	s.waitReadyz(t, http.StatusServiceUnavailable, "/readyz to fail without postgres", func(b string) bool {
		return strings.Contains(b, "postgres:") && strings.Contains(b, "not streaming")
	})
	poll(t, "a last error in /status", func() (bool, string) {
		st := s.status(t)
		return st.LastError != "", "no last_error"
	})
	collect(s, "postgres down")
	if err := e.pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s.waitReadyz(t, http.StatusOK, "the daemon to be ready again", nil)
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}

	// A URL that does not parse is reported without its password.
	bad := e.cfg
	bad.DatabaseURL = "postgres://walcount_pw:" + pgSecret + "@127.0.0.1:notaport/postgres"
	if _, err := New(Options{Config: bad}); err == nil {
		t.Error("New accepted a database URL with a bad port")
	} else {
		outputs = append(outputs, "New error: "+err.Error())
	}
	bad = e.cfg
	bad.RedisURL = "redis://:" + redisSecret + "@127.0.0.1:notaport/0"
	if _, err := New(Options{Config: bad}); err == nil {
		t.Error("New accepted a redis URL with a bad port")
	} else {
		outputs = append(outputs, "New error: "+err.Error())
	}

	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	for _, l := range s.logs.All() {
		buf, err := enc.EncodeEntry(l.Entry, l.Context)
		if err != nil {
			t.Fatal(err)
		}
		outputs = append(outputs, "log: "+buf.String())
		buf.Free()
	}
	all := strings.Join(outputs, "\n")
	for _, secret := range []string{pgSecret, redisSecret} {
		for _, out := range outputs {
			if strings.Contains(out, secret) {
				t.Errorf("a password appears in:\n%s", out)
			}
		}
	}
	// The checks above must have looked at the real thing: the masked URLs
	// and the outage's errors are in what was collected.
	for _, want := range []string{"walcount_pw:xxxxx@", "redis://:xxxxx@", `"last_error"`, "walcount_slot_lag_bytes"} {
		if !strings.Contains(all, want) {
			t.Errorf("collected outputs lack %q, so the password check proves little", want)
		}
	}
	t.Logf("checked %d outputs (%d bytes) for the passwords", len(outputs), len(all))
}
