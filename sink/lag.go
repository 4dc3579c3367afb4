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
	for ; i < len(l.samples) && l.samples[i].end <= w; i++ {
		if h != nil {
			h.Observe(now.Sub(l.samples[i].commit).Seconds())
		}
	}
	l.samples = append(l.samples[:0], l.samples[i:]...)
}

// Reset forgets every sample (a session restart replays them).
func (l *LagTracker) Reset() {
	l.mu.Lock()
	l.samples = l.samples[:0]
	l.mu.Unlock()
}
