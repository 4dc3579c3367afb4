package stats

import (
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	xs := []int{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	for _, tt := range []struct {
		q    float64
		want int
	}{{0, 10}, {0.5, 60}, {0.99, 100}, {1, 100}, {0.1, 20}, {-1, 10}} {
		if got := Quantile(xs, tt.q); got != tt.want {
			t.Errorf("Quantile(%v) = %d, want %d", tt.q, got, tt.want)
		}
	}
	if got := Quantile([]time.Duration(nil), 0.5); got != 0 {
		t.Errorf("Quantile of nothing = %v, want 0", got)
	}
	if got := Quantile([]float64{2.5}, 0.99); got != 2.5 {
		t.Errorf("Quantile of one = %v, want 2.5", got)
	}
}
