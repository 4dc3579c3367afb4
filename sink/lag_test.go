package sink

import (
	"testing"
	"time"
)

// TestLagTrackerLag reports the wait of the oldest transaction not yet
// applied and the largest lag of the last flush's transactions.
func TestLagTrackerLag(t *testing.T) {
	t.Parallel()
	l := NewLagTracker(0)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := l.Lag(t0); got.PendingSeconds != 0 || got.LastFlushSeconds != nil {
		t.Fatalf("empty tracker: %+v", got)
	}
	l.Record(10, t0)
	l.Record(20, t0.Add(time.Second))
	l.Record(30, t0.Add(3*time.Second))
	if got := l.Lag(t0.Add(5 * time.Second)); got.PendingSeconds != 5 || got.LastFlushSeconds != nil {
		t.Fatalf("before a flush: %+v, want 5s pending", got)
	}
	l.Applied(20, t0.Add(6*time.Second), nil)
	got := l.Lag(t0.Add(7 * time.Second))
	if got.PendingSeconds != 4 || got.LastFlushSeconds == nil || *got.LastFlushSeconds != 6 {
		t.Fatalf("after the flush of 20: %+v, want 4s pending and 6s last", got)
	}
	l.Applied(30, t0.Add(8*time.Second), nil)
	got = l.Lag(t0.Add(9 * time.Second))
	if got.PendingSeconds != 0 || *got.LastFlushSeconds != 5 {
		t.Fatalf("after the flush of 30: %+v, want 0 pending and 5s last", got)
	}
	l.Applied(30, t0.Add(20*time.Second), nil) // a flush that applied nothing new
	if got = l.Lag(t0.Add(21 * time.Second)); *got.LastFlushSeconds != 5 {
		t.Fatalf("an empty flush changed the last lag: %+v", got)
	}
}
