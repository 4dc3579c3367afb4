package sink

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcount/walcount/cdc"
)

// DefaultLagSamples bounds the commit times kept for the apply-lag
// histogram; past it, new samples are dropped until a flush frees room.
const DefaultLagSamples = 1 << 18

// LagTracker remembers the source commit time of transactions until the
// flush that applies them commits, to measure walcount_apply_lag_seconds.
// It is safe for concurrent use.
type LagTracker struct {
	mu      sync.Mutex
	samples []lagSample
	max     int
	// last is the largest lag of the transactions the last flush that
	// applied any applied, and lastAt when that flush committed.
	last   time.Duration
	lastAt time.Time
}

type lagSample struct {
	end    cdc.LSN
	commit time.Time
}

// NewLagTracker returns a tracker holding at most max samples (default
// DefaultLagSamples when max <= 0).
func NewLagTracker(max int) *LagTracker {
	if max <= 0 {
		max = DefaultLagSamples
	}
	return &LagTracker{max: max}
}

// Record notes that the transaction ending at end committed at commit.
// Samples must be recorded in LSN order.
func (l *LagTracker) Record(end cdc.LSN, commit time.Time) {
	l.mu.Lock()
	if len(l.samples) < l.max {
		l.samples = append(l.samples, lagSample{end, commit})
	}
	l.mu.Unlock()
}

// Applied observes the lag of every sample at or below w, as of now.
func (l *LagTracker) Applied(w cdc.LSN, now time.Time, h prometheus.Observer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	var worst time.Duration
	for ; i < len(l.samples) && l.samples[i].end <= w; i++ {
		lag := now.Sub(l.samples[i].commit)
		worst = max(worst, lag)
		if h != nil {
			h.Observe(lag.Seconds())
		}
	}
	if i > 0 {
		l.last, l.lastAt = worst, now
	}
	l.samples = append(l.samples[:0], l.samples[i:]...)
}

// Reset forgets every sample (a session restart replays them).
func (l *LagTracker) Reset() {
	l.mu.Lock()
	l.samples = l.samples[:0]
	l.mu.Unlock()
}

// ApplyLag is what LagTracker says of the apply lag: how long the oldest
// transaction received and not yet applied has waited since its commit
// (0 when every one received is applied), and the largest lag of the
// transactions the last flush applied.
type ApplyLag struct {
	PendingSeconds   float64    `json:"pending_seconds"`
	LastFlushSeconds *float64   `json:"last_flush_seconds,omitempty"`
	LastFlushAt      *time.Time `json:"last_flush_at,omitempty"`
}

// Lag returns the apply lag as of now.
func (l *LagTracker) Lag(now time.Time) ApplyLag {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out ApplyLag
	if len(l.samples) > 0 {
		out.PendingSeconds = max(now.Sub(l.samples[0].commit), 0).Seconds()
	}
	if !l.lastAt.IsZero() {
		s, at := l.last.Seconds(), l.lastAt
		out.LastFlushSeconds, out.LastFlushAt = &s, &at
	}
	return out
}
