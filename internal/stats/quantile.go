// Package stats holds the one quantile computation that the demo and the
// benchmark share, so that their p50 and p99 mean the same thing.
package stats

import "cmp"

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of sorted, which must be in
// ascending order, by nearest rank: the element at index ⌊q·n⌋, or the last
// one when that is past the end. It returns the zero value for an empty
// slice.
func Quantile[T cmp.Ordered](sorted []T, q float64) T {
	var zero T
	if len(sorted) == 0 {
		return zero
	}
	i := int(q * float64(len(sorted)))
	return sorted[min(max(i, 0), len(sorted)-1)]
}
