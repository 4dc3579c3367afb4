package demo

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walcount/walcount/internal/stats"
)

// maxLagSamples bounds the apply-lag samples a lagRecorder keeps; past it
// the older half is dropped.
const maxLagSamples = 1 << 21

// lagRecorder wraps the daemon's walcount_apply_lag_seconds histogram and
// keeps every observation as well, so that the view shows exact quantiles.
// The histogram's buckets around the default flush interval are 1 s and
// 2 s: interpolating inside them would show a p99 near 2 s for lags just
// over 1 s. It is safe for concurrent use.
type lagRecorder struct {
	prometheus.Histogram

	mu      sync.Mutex
	samples []lagSample
}

type lagSample struct {
	at  time.Time
	lag float64 // seconds
}

var _ prometheus.Histogram = (*lagRecorder)(nil)

func newLagRecorder(h prometheus.Histogram) *lagRecorder { return &lagRecorder{Histogram: h} }

// Observe records v and passes it on to the histogram.
func (r *lagRecorder) Observe(v float64) {
	r.Histogram.Observe(v)
	r.mu.Lock()
	if len(r.samples) >= maxLagSamples {
		r.samples = append(r.samples[:0], r.samples[len(r.samples)/2:]...)
	}
	r.samples = append(r.samples, lagSample{at: time.Now(), lag: v})
	r.mu.Unlock()
}

// quantiles returns the p50 and p99 of the lags observed since the given
// time; NaN when there are none.
func (r *lagRecorder) quantiles(since time.Time) (p50, p99 float64) {
	r.mu.Lock()
	i, _ := slices.BinarySearchFunc(r.samples, since, func(s lagSample, t time.Time) int { return s.at.Compare(t) })
	lags := make([]float64, 0, len(r.samples)-i)
	for _, s := range r.samples[i:] {
		lags = append(lags, s.lag)
	}
	r.mu.Unlock()
	return exactQuantile(lags, 0.5), exactQuantile(lags, 0.99)
}

// exactQuantile returns the q-quantile of xs (nearest rank, as the
// benchmark computes it), NaN when there is none; it sorts xs.
func exactQuantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return nan
	}
	slices.Sort(xs)
	return stats.Quantile(xs, q)
}
