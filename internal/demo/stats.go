package demo

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Bucket is one cumulative histogram bucket: Count observations were
// less than or equal to UpperBound.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// Buckets returns the cumulative buckets of a histogram, ending with the
// +Inf bucket that holds the sample count.
func Buckets(h *dto.Histogram) []Bucket {
	out := make([]Bucket, 0, len(h.GetBucket())+1)
	for _, b := range h.GetBucket() {
		out = append(out, Bucket{UpperBound: b.GetUpperBound(), Count: b.GetCumulativeCount()})
	}
	if n := len(out); n == 0 || !math.IsInf(out[n-1].UpperBound, 1) {
		out = append(out, Bucket{UpperBound: math.Inf(1), Count: h.GetSampleCount()})
	}
	return out
}

// SubBuckets returns the observations of cur that are not in prev, the
// same histogram read earlier: the histogram of a time window.
func SubBuckets(cur, prev []Bucket) []Bucket {
	if len(prev) != len(cur) {
		return cur
	}
	out := make([]Bucket, len(cur))
	for i := range cur {
		out[i] = Bucket{UpperBound: cur[i].UpperBound, Count: cur[i].Count - prev[i].Count}
	}
	return out
}

// Quantile estimates the q-quantile (0 < q < 1) of cumulative buckets the
// way PromQL's histogram_quantile does: it finds the bucket that holds the
// rank and interpolates linearly inside it, taking 0 as the lower bound of
// the first bucket. A rank in the +Inf bucket yields the highest finite
// bound. It returns NaN when there are no observations.
func Quantile(q float64, buckets []Bucket) float64 {
	if len(buckets) == 0 {
		return math.NaN()
	}
	total := buckets[len(buckets)-1].Count
	if total == 0 {
		return math.NaN()
	}
	rank := q * float64(total)
	lower, below := 0.0, uint64(0)
	for i, b := range buckets {
		if float64(b.Count) >= rank {
			if math.IsInf(b.UpperBound, 1) {
				if i == 0 {
					return math.NaN()
				}
				return buckets[i-1].UpperBound
			}
			in := b.Count - below
			if in == 0 {
				return b.UpperBound
			}
			return lower + (b.UpperBound-lower)*(rank-float64(below))/float64(in)
		}
		lower, below = b.UpperBound, b.Count
	}
	return buckets[len(buckets)-1].UpperBound
}

// read returns the current state of one metric.
func read(m prometheus.Metric) *dto.Metric {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		return &dto.Metric{}
	}
	return &out
}

// counterValue returns a counter's value.
func counterValue(c prometheus.Counter) float64 { return read(c).GetCounter().GetValue() }

// gaugeValue returns a gauge's value.
func gaugeValue(g prometheus.Gauge) float64 { return read(g).GetGauge().GetValue() }

// histogramBuckets returns a histogram's cumulative buckets.
func histogramBuckets(h prometheus.Histogram) []Bucket {
	return Buckets(read(h).GetHistogram())
}
