package demo

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/walcount/walcount/internal/testkit/wait"
)

func TestLagRecorder(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lag", Buckets: []float64{1, 2}})
	r := newLagRecorder(h)
	if p50, p99 := r.quantiles(time.Time{}); !math.IsNaN(p50) || !math.IsNaN(p99) {
		t.Errorf("quantiles of nothing = %v, %v; want NaN", p50, p99)
	}
	for i := 1; i <= 100; i++ {
		r.Observe(float64(i) / 100) // 0.01 .. 1.00
	}
	mid := time.Now()
	// The next observation's time must be after mid.
	wait.For(t, time.Second, "the clock past mid", func() bool { return time.Now().After(mid) })
	r.Observe(1.05)
	if p50, p99 := r.quantiles(time.Time{}); p50 != 0.51 || p99 != 1.0 {
		t.Errorf("quantiles of all = %v, %v; want 0.51, 1", p50, p99)
	}
	if p50, p99 := r.quantiles(mid); p50 != 1.05 || p99 != 1.05 {
		t.Errorf("quantiles since mid = %v, %v; want 1.05, 1.05", p50, p99)
	}
	// The histogram still gets every observation.
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetHistogram().GetSampleCount(); n != 101 {
		t.Errorf("histogram holds %d samples, want 101", n)
	}
}
