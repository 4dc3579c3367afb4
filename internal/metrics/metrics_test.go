package metrics_test

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/walcount/walcount/internal/buildinfo"
	"github.com/walcount/walcount/internal/metrics"
)

// designNames are the metric names docs/design.md §6 promises, copied from the
// document rather than from the package so that renaming a metric fails here.
var designNames = []string{
	"walcount_slot_lag_bytes",
	"walcount_slot_retained_wal_bytes",
	"walcount_slot_safe_wal_size_bytes",
	"walcount_slot_active",
	"walcount_slot_wal_status",
	"walcount_checkpoint_lsn",
	"walcount_received_lsn",
	"walcount_transactions_total",
	"walcount_changes_total",
	"walcount_flushes_total",
	"walcount_flush_duration_seconds",
	"walcount_deltas_flushed_total",
	"walcount_deltas_dropped_total",
	"walcount_buffer_keys",
	"walcount_apply_lag_seconds",
	"walcount_reconcile_corrections_total",
}

// extraNames are the other names the deployment assets rely on.
var extraNames = []string{
	"walcount_slot_spill_bytes_total",
	"walcount_slot_spill_txns_total",
	"walcount_slot_stream_bytes_total",
	"walcount_slot_stream_txns_total",
	"walcount_slot_read_errors_total",
	"walcount_checkpoint_age_seconds",
	"walcount_flush_errors_total",
	"walcount_reconcile_keys_checked_total",
	"walcount_queue_blocked_seconds_total",
	"walcount_queue_depth",
	"walcount_streaming",
	"walcount_waiting_for_slot",
	"walcount_session_failures_total",
	"walcount_stream_timeouts_total",
	"walcount_standby_wait_seconds",
	"walcount_build_info",
	"go_goroutines",
	"go_gc_heap_live_bytes",
	"process_cpu_seconds_total",
}

func gather(t *testing.T, m *metrics.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	byName := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	return byName
}

func TestEveryDesignMetricIsRegistered(t *testing.T) {
	m := metrics.New()
	m.InitCounter("post_likes")
	got := gather(t, m)
	for _, name := range append(designNames, extraNames...) {
		if _, ok := got[name]; !ok {
			t.Errorf("metric %s is not exported", name)
		}
	}
	for name, mf := range got {
		if mf.GetHelp() == "" {
			t.Errorf("metric %s has no help text", name)
		}
	}
}

func TestLabels(t *testing.T) {
	m := metrics.New()
	m.InitCounter("post_likes")
	got := gather(t, m)

	ops := map[string]bool{}
	for _, mt := range got["walcount_changes_total"].GetMetric() {
		l := labels(mt)
		if l["counter"] != "post_likes" {
			t.Errorf("walcount_changes_total has counter=%q, want post_likes", l["counter"])
		}
		ops[l["op"]] = true
	}
	for _, op := range []string{"insert", "update", "delete", "truncate"} {
		if !ops[op] {
			t.Errorf("walcount_changes_total has no op=%q series", op)
		}
	}
	for _, name := range []string{
		"walcount_deltas_flushed_total", "walcount_deltas_dropped_total",
		"walcount_reconcile_corrections_total", "walcount_reconcile_keys_checked_total",
	} {
		ms := got[name].GetMetric()
		if len(ms) != 1 || labels(ms[0])["counter"] != "post_likes" {
			t.Errorf("%s: want one series with counter=post_likes, got %v", name, ms)
		}
	}
	if bi := got["walcount_build_info"].GetMetric(); len(bi) != 1 || labels(bi[0])["version"] == "" {
		t.Errorf("walcount_build_info: want one series with a version, got %v", bi)
	}
}

func TestSetWALStatus(t *testing.T) {
	m := metrics.New()
	if v := walStatus(t, m); len(v) != 4 || v["reserved"]+v["extended"]+v["unreserved"]+v["lost"] != 0 {
		t.Fatalf("initial walcount_slot_wal_status = %v, want all four at 0", v)
	}
	for _, status := range []string{"reserved", "extended", "unreserved", "lost"} {
		m.SetWALStatus(status)
		for s, v := range walStatus(t, m) {
			want := 0.0
			if s == status {
				want = 1
			}
			if v != want {
				t.Errorf("after SetWALStatus(%q): status=%q is %v, want %v", status, s, v, want)
			}
		}
	}
	m.SetWALStatus("")
	for s, v := range walStatus(t, m) {
		if v != 0 {
			t.Errorf("after SetWALStatus(\"\"): status=%q is %v, want 0", s, v)
		}
	}
}

// TestBuildInfo checks that walcount_build_info starts with the running
// binary's build information and that SetBuildInfo replaces the series.
func TestBuildInfo(t *testing.T) {
	m := metrics.New()
	own := buildinfo.Get()
	bi := gather(t, m)["walcount_build_info"].GetMetric()
	want := map[string]string{"version": own.Version, "revision": own.Revision, "modified": own.Modified, "goversion": runtime.Version()}
	if len(bi) != 1 || !maps.Equal(labels(bi[0]), want) || bi[0].GetGauge().GetValue() != 1 {
		t.Errorf("walcount_build_info = %v, want one series %v value 1", bi, want)
	}

	m.SetBuildInfo(buildinfo.Info{Version: "v1.2.3", Revision: "889f495c1d2e0000000000000000000000000000", Modified: buildinfo.ModifiedTrue, GoVersion: "go1.26.8"})
	bi = gather(t, m)["walcount_build_info"].GetMetric()
	want = map[string]string{"version": "v1.2.3", "revision": "889f495c1d2e0000000000000000000000000000", "modified": "true", "goversion": "go1.26.8"}
	if len(bi) != 1 || !maps.Equal(labels(bi[0]), want) || bi[0].GetGauge().GetValue() != 1 {
		t.Fatalf("walcount_build_info after SetBuildInfo = %v, want one series %v value 1", bi, want)
	}
}

func TestSafeWALSizeStartsUnknown(t *testing.T) {
	m := metrics.New()
	mf := gather(t, m)["walcount_slot_safe_wal_size_bytes"]
	if v := mf.GetMetric()[0].GetGauge().GetValue(); v != -1 {
		t.Fatalf("walcount_slot_safe_wal_size_bytes = %v before the first read, want -1", v)
	}
}

func TestHandlerServesTheExpositionFormat(t *testing.T) {
	m := metrics.New()
	m.Transactions.Add(3)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatalf("get /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	tx, ok := mfs["walcount_transactions_total"]
	if !ok {
		t.Fatal("walcount_transactions_total missing from /metrics")
	}
	if v := tx.GetMetric()[0].GetCounter().GetValue(); v != 3 {
		t.Fatalf("walcount_transactions_total = %v, want 3", v)
	}
}

func walStatus(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mt := range gather(t, m)["walcount_slot_wal_status"].GetMetric() {
		out[labels(mt)["status"]] = mt.GetGauge().GetValue()
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// TestSessionFailuresStartAtZero checks that both stages are exported from
// the start, so that increase() sees the first failure.
func TestSessionFailuresStartAtZero(t *testing.T) {
	got := gather(t, metrics.New())
	stages := map[string]float64{}
	for _, mt := range got["walcount_session_failures_total"].GetMetric() {
		stages[labels(mt)["stage"]] = mt.GetCounter().GetValue()
	}
	if len(stages) != 2 || stages["start"] != 0 || stages["streaming"] != 0 {
		t.Errorf("walcount_session_failures_total = %v, want stage start and streaming at 0", stages)
	}
}

// TestStreamingEndsWaitingForSlot checks that a standby that takes over
// (it streams) no longer reports that it waits for the slot.
func TestStreamingEndsWaitingForSlot(t *testing.T) {
	m := metrics.New()
	value := func(name string) float64 {
		return gather(t, m)[name].GetMetric()[0].GetGauge().GetValue()
	}
	m.WaitingForSlot.Set(1)
	m.Streaming.Set(0)
	if value("walcount_waiting_for_slot") != 1 || value("walcount_streaming") != 0 {
		t.Fatalf("waiting %v, streaming %v; want 1, 0", value("walcount_waiting_for_slot"), value("walcount_streaming"))
	}
	m.Streaming.Set(1)
	if value("walcount_waiting_for_slot") != 0 || value("walcount_streaming") != 1 {
		t.Errorf("after streaming: waiting %v, streaming %v; want 0, 1", value("walcount_waiting_for_slot"), value("walcount_streaming"))
	}
}
