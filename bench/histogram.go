package main

import (
	"math"

	dto "github.com/prometheus/client_model/go"
)

// bucket is one cumulative histogram bucket: Count observations were
// less than or equal to UpperBound.
type bucket struct {
	UpperBound float64
	Count      uint64
}

// histBuckets returns the cumulative buckets of a histogram, ending with the
// +Inf bucket that holds the sample count.
func histBuckets(h *dto.Histogram) []bucket {
	out := make([]bucket, 0, len(h.GetBucket())+1)
	for _, b := range h.GetBucket() {
		out = append(out, bucket{UpperBound: b.GetUpperBound(), Count: b.GetCumulativeCount()})
	}
	if n := len(out); n == 0 || !math.IsInf(out[n-1].UpperBound, 1) {
		out = append(out, bucket{UpperBound: math.Inf(1), Count: h.GetSampleCount()})
	}
	return out
}

// subBuckets returns the observations of cur that are not in prev, the
// same histogram read earlier: the histogram of a time window.
func subBuckets(cur, prev []bucket) []bucket {
	if len(prev) != len(cur) {
		return cur
	}
	out := make([]bucket, len(cur))
	for i := range cur {
		out[i] = bucket{UpperBound: cur[i].UpperBound, Count: cur[i].Count - prev[i].Count}
	}
	return out
}

// histQuantile estimates the q-quantile (0 < q < 1) of cumulative buckets the
// way PromQL's histogram_quantile does: it finds the bucket that holds the
// rank and interpolates linearly inside it, taking 0 as the lower bound of
// the first bucket. A rank in the +Inf bucket yields the highest finite
// bound. It returns NaN when there are no observations.
func histQuantile(q float64, buckets []bucket) float64 {
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
