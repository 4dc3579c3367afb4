package slot

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/internal/metrics"
)

// These tests feed readings to the monitor's logging and export logic
// directly. A real server cannot be held in wal_status "unreserved": the
// next checkpoint, which the server requests on its own as WAL grows, turns
// it into "lost" (the server-backed tests in monitor_test.go cover that).

func newTestMonitor(maxLag int64) (*Monitor, *metrics.Metrics, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	m := metrics.New()
	return New(Options{Slot: "walcount", Interval: time.Second, MaxLagBytes: maxLag, Metrics: m, Logger: zap.New(core)}), m, logs
}

func reading(status string, lag int64) SlotStatus {
	safe := int64(1 << 20)
	return SlotStatus{
		Slot: "walcount", Exists: true, Plugin: "pgoutput", SlotType: "logical",
		WALStatus: status, SafeWALSizeBytes: &safe, LagBytes: lag, RetainedWALBytes: lag,
		ReadAt: time.Now(),
	}
}

// feed runs the part of poll that follows a successful read.
func feed(m *Monitor, s SlotStatus) {
	m.mu.Lock()
	m.latest, m.haveRead = s, true
	m.mu.Unlock()
	m.export(s)
	m.logTransitions(s)
}

func TestUnreservedIsLoggedOncePerChange(t *testing.T) {
	t.Parallel()
	mon, mt, logs := newTestMonitor(0)
	for _, s := range []string{WALReserved, WALReserved, WALUnreserved, WALUnreserved, WALUnreserved, WALExtended, WALUnreserved} {
		feed(mon, reading(s, 0))
	}
	var unreserved, extended int
	for _, e := range logs.All() {
		switch e.ContextMap()[fieldWALStatus] {
		case WALUnreserved:
			unreserved++
			if e.Level != zapcore.ErrorLevel {
				t.Errorf("unreserved logged at %s, want error", e.Level)
			}
		case WALExtended:
			extended++
		}
	}
	if unreserved != 2 || extended != 1 {
		t.Errorf("logged unreserved %d times and extended %d times, want 2 and 1 (once per change):\n%v",
			unreserved, extended, logs.All())
	}
	if v := value(mt.SlotWALStatus.WithLabelValues(WALUnreserved)); v != 1 {
		t.Errorf("walcount_slot_wal_status{status=unreserved} = %v, want 1", v)
	}
	if v := value(mt.SlotWALStatus.WithLabelValues(WALReserved)); v != 0 {
		t.Errorf("walcount_slot_wal_status{status=reserved} = %v, want 0", v)
	}
}

func TestHealthyFirstReadingLogsNothing(t *testing.T) {
	t.Parallel()
	mon, _, logs := newTestMonitor(1 << 30)
	feed(mon, reading(WALReserved, 100))
	feed(mon, reading(WALReserved, 200))
	if n := logs.Len(); n != 0 {
		t.Fatalf("healthy readings logged %d entries: %v", n, logs.All())
	}
}

func TestLagWarningIsRateLimited(t *testing.T) {
	t.Parallel()
	mon, mt, logs := newTestMonitor(1000)
	for _, lag := range []int64{10, 2000, 3000, 4000, 10, 5000} {
		feed(mon, reading(WALReserved, lag))
	}
	var warns, infos int
	for _, e := range logs.All() {
		switch e.Level {
		case zapcore.WarnLevel:
			warns++
		case zapcore.InfoLevel:
			infos++
		}
	}
	// Warned when the lag first crossed the maximum and when it crossed it
	// again after recovering; told once that it recovered.
	if warns != 2 || infos != 1 {
		t.Errorf("got %d warnings and %d infos, want 2 and 1:\n%v", warns, infos, logs.All())
	}
	if v := value(mt.SlotLagBytes); v != 5000 {
		t.Errorf("walcount_slot_lag_bytes = %v, want 5000", v)
	}
	if err := mon.LagOK(); !errors.Is(err, ErrLagTooHigh) {
		t.Errorf("LagOK = %v, want ErrLagTooHigh", err)
	}
}

func TestMissingSlot(t *testing.T) {
	t.Parallel()
	mon, mt, logs := newTestMonitor(1000)
	feed(mon, reading(WALReserved, 10))
	mt.SlotActive.Set(1)
	missing := SlotStatus{Slot: "walcount", ReadAt: time.Now()}
	feed(mon, missing)
	feed(mon, missing)
	if n := logs.FilterMessageSnippet("does not exist").Len(); n != 1 {
		t.Errorf("logged a missing slot %d times, want once:\n%v", n, logs.All())
	}
	if err := mon.LagOK(); !errors.Is(err, ErrSlotNotFound) {
		t.Errorf("LagOK = %v, want ErrSlotNotFound", err)
	}
	if v := value(mt.SlotActive); v != 0 {
		t.Errorf("walcount_slot_active = %v for a missing slot, want 0", v)
	}
}

func TestInvalidatedWithNullWALStatusExportsLost(t *testing.T) {
	t.Parallel()
	mon, mt, _ := newTestMonitor(0)
	s := reading("", 0)
	s.SafeWALSizeBytes, s.Invalidated = nil, true
	feed(mon, s)
	if v := value(mt.SlotWALStatus.WithLabelValues(WALLost)); v != 1 {
		t.Errorf("walcount_slot_wal_status{status=lost} = %v, want 1", v)
	}
	if v := value(mt.SlotSafeWALSizeBytes); v != -1 {
		t.Errorf("walcount_slot_safe_wal_size_bytes = %v, want -1", v)
	}
	var lost *SlotLostError
	if err := mon.LagOK(); !errors.As(err, &lost) || !errors.Is(err, ErrSlotLost) {
		t.Errorf("LagOK = %v, want a *SlotLostError", err)
	}
}

func TestLagOKBeforeAndAfterReads(t *testing.T) {
	t.Parallel()
	mon, _, _ := newTestMonitor(1000)
	if err := mon.LagOK(); !errors.Is(err, ErrNotRead) {
		t.Errorf("LagOK before any read = %v, want ErrNotRead", err)
	}
	feed(mon, reading(WALReserved, 10))
	if err := mon.LagOK(); err != nil {
		t.Errorf("LagOK after a fresh healthy read = %v, want nil", err)
	}
	old := reading(WALReserved, 10)
	old.ReadAt = time.Now().Add(-time.Hour)
	feed(mon, old)
	mon.readFailed(errors.New("connection refused"))
	err := mon.LagOK()
	if !errors.Is(err, ErrNotRead) {
		t.Errorf("LagOK with an hour-old reading = %v, want ErrNotRead", err)
	}
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("LagOK = %v, want it to carry the last read error", err)
	}
}

func TestSlotLostErrorMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  SlotLostError
		want string
	}{
		{SlotLostError{Slot: "walcount", WALStatus: "lost"},
			"replication slot \"walcount\" is lost (wal_status=lost): WAL it needed was removed; " +
				"counts can no longer be kept exact from the stream. " +
				"Run `walcount setup --recreate-slot` (walcount then repairs every counter by itself), or set on_slot_loss: recreate"},
		{SlotLostError{Slot: "walcount", WALStatus: "lost", Reason: "wal_removed"},
			"replication slot \"walcount\" is lost (wal_status=lost): WAL it needed was removed; " +
				"counts can no longer be kept exact from the stream. " +
				"Run `walcount setup --recreate-slot` (walcount then repairs every counter by itself), or set on_slot_loss: recreate"},
		{SlotLostError{Slot: "walcount", Reason: "rows_removed"},
			"replication slot \"walcount\" is invalidated (wal_status=null, invalidation_reason=rows_removed: rows the slot needed were removed on the primary (a standby's slot)): " +
				"the server will not decode changes for it any more; " +
				"counts can no longer be kept exact from the stream. " +
				"Run `walcount setup --recreate-slot` (walcount then repairs every counter by itself), or set on_slot_loss: recreate"},
		{SlotLostError{Slot: "walcount", WALStatus: "lost", Reason: "idle_timeout"},
			"replication slot \"walcount\" is invalidated (wal_status=lost, invalidation_reason=idle_timeout: the slot had no reader for longer than idle_replication_slot_timeout): " +
				"the server will not decode changes for it any more; " +
				"counts can no longer be kept exact from the stream. " +
				"Run `walcount setup --recreate-slot` (walcount then repairs every counter by itself), or set on_slot_loss: recreate"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() =\n%s\nwant\n%s", got, tt.want)
		}
		if !errors.Is(&tt.err, ErrSlotLost) {
			t.Errorf("%v does not wrap ErrSlotLost", &tt.err)
		}
	}
}

// value reads a gauge or counter.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
