package aggregator

import (
	"iter"
	"strings"
)

// deltaSet sums deltas per buffer field ("counter:key"). Adding to a field
// it already holds does not allocate: the lookup converts the key bytes
// without copying, and the sum lives in a slice, not in the map.
type deltaSet struct {
	idx  map[string]int32
	vals []int64
}

func newDeltaSet() deltaSet { return deltaSet{idx: make(map[string]int32)} }

// addField adds n to the field made of counter, ':' and key; buf is
// scratch space the caller keeps between calls.
func (d *deltaSet) addField(buf *[]byte, counter string, key []byte, n int64) {
	b := append(append(append((*buf)[:0], counter...), ':'), key...)
	*buf = b
	if i, ok := d.idx[string(b)]; ok {
		d.vals[i] += n
		return
	}
	d.idx[string(b)] = int32(len(d.vals))
	d.vals = append(d.vals, n)
}

// add adds n to field.
func (d *deltaSet) add(field string, n int64) {
	if i, ok := d.idx[field]; ok {
		d.vals[i] += n
		return
	}
	d.idx[field] = int32(len(d.vals))
	d.vals = append(d.vals, n)
}

// all yields every field whose sum is not zero.
func (d *deltaSet) all() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		for f, i := range d.idx {
			if n := d.vals[i]; n != 0 && !yield(f, n) {
				return
			}
		}
	}
}

// dropCounter zeroes every field of counter.
func (d *deltaSet) dropCounter(counter string) {
	prefix := counter + ":"
	for f, i := range d.idx {
		if strings.HasPrefix(f, prefix) {
			d.vals[i] = 0
		}
	}
}

// move moves field's sum to to, or drops it when to is "".
func (d *deltaSet) move(field, to string) {
	i, ok := d.idx[field]
	if !ok || d.vals[i] == 0 {
		return
	}
	n := d.vals[i]
	d.vals[i] = 0
	if to != "" {
		d.add(to, n)
	}
}

// size is the number of distinct fields held, zero sums included.
func (d *deltaSet) size() int { return len(d.idx) }

func (d *deltaSet) reset() {
	clear(d.idx)
	d.vals = d.vals[:0]
}

// toMap returns the non-zero sums (for tests and small barriers).
func (d *deltaSet) toMap() map[string]int64 {
	m := make(map[string]int64, len(d.idx))
	for f, n := range d.all() {
		m[f] = n
	}
	return m
}
