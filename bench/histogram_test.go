package main

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name    string
		q       float64
		buckets []bucket
		want    float64
	}{
		{"empty", 0.5, nil, math.NaN()},
		{"no samples", 0.5, []bucket{{1, 0}, {inf, 0}}, math.NaN()},
		{"middle of first bucket", 0.5, []bucket{{1, 10}, {2, 10}, {inf, 10}}, 0.5},
		{"interpolated", 0.75, []bucket{{1, 10}, {2, 20}, {inf, 20}}, 1.5},
		{"empty bucket skipped", 0.99, []bucket{{0.5, 50}, {1, 50}, {2, 100}, {inf, 100}}, 1.98},
		{"in +Inf", 0.99, []bucket{{1, 10}, {inf, 20}}, 1},
		{"all in +Inf", 0.5, []bucket{{inf, 5}}, math.NaN()},
	}
	for _, tt := range tests {
		got := histQuantile(tt.q, tt.buckets)
		if math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && math.Abs(got-tt.want) > 1e-9) {
			t.Errorf("%s: histhistQuantile(%v) = %v, want %v", tt.name, tt.q, got, tt.want)
		}
	}
}

func TestSubBuckets(t *testing.T) {
	inf := math.Inf(1)
	got := subBuckets([]bucket{{1, 5}, {inf, 9}}, []bucket{{1, 2}, {inf, 3}})
	want := []bucket{{1, 3}, {inf, 6}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("subBuckets = %v, want %v", got, want)
	}
}
