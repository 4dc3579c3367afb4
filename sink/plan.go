package sink

import (
	"fmt"
	"slices"
	"sort"
	"strconv"

	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// counterBatch is one counter's deltas, sorted by key.
type counterBatch struct {
	t      *counter.Resolved
	keys   []string
	deltas []int64
}

// group splits buffer fields by counter and sorts each counter's keys; the
// counters that create rows come first.
func (f *Flusher) group(fields map[string]int64) ([]*counterBatch, error) {
	by := make(map[string]*counterBatch)
	for field, n := range fields {
		name, key, ok := counter.SplitField(field)
		if !ok {
			return nil, fmt.Errorf("group deltas: malformed buffer field %q", field)
		}
		if n == 0 {
			continue
		}
		t := f.targets[name]
		if t == nil {
			// The counter was removed from the config while its deltas
			// were buffered: there is nowhere to apply them.
			f.log.Warn("dropping deltas of an unknown counter", zap.String("counter", name), zap.String("key", key))
			f.opt.Metrics.DeltasDropped.WithLabelValues(name).Inc()
			f.opt.Tally.Add(name, counter.TallyDropped, 1)
			continue
		}
		b := by[name]
		if b == nil {
			b = &counterBatch{t: t}
			by[name] = b
		}
		b.keys = append(b.keys, key)
		b.deltas = append(b.deltas, n)
	}
	out := make([]*counterBatch, 0, len(by))
	for _, b := range by {
		sort.Sort(byKey{b})
		out = append(out, b)
	}
	// The counters that create missing target rows run first, in name
	// order, then the others: a counter that creates no rows (a max, a
	// count without create_missing) on the same target then updates the
	// row created in this transaction instead of missing it.
	slices.SortFunc(out, func(a, b *counterBatch) int {
		if ca, cb := a.t.Counter.CreateMissing, b.t.Counter.CreateMissing; ca != cb {
			if ca {
				return -1
			}
			return 1
		}
		return compareStrings(a.t.Counter.Name, b.t.Counter.Name)
	})
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// byKey sorts a counterBatch by key: numerically for integer keys.
type byKey struct{ b *counterBatch }

func (s byKey) Len() int { return len(s.b.keys) }
func (s byKey) Swap(i, j int) {
	s.b.keys[i], s.b.keys[j] = s.b.keys[j], s.b.keys[i]
	s.b.deltas[i], s.b.deltas[j] = s.b.deltas[j], s.b.deltas[i]
}
func (s byKey) Less(i, j int) bool {
	a, b := s.b.keys[i], s.b.keys[j]
	if s.b.t.IntKey {
		x, errx := strconv.ParseInt(a, 10, 64)
		y, erry := strconv.ParseInt(b, 10, 64)
		if errx == nil && erry == nil {
			return x < y
		}
	}
	return a < b
}

// attemptBatch is a counterBatch with what the keys were carried as.
type attemptBatch struct {
	*counterBatch
	// careful: every chunk in a savepoint (parked keys tried again).
	careful bool
}

// plan merges what earlier flushes carried into the batch: the batch's
// lifecycle moves run first on the carried deltas (they are of rows as
// they were at W), then a parked key not due yet keeps the batch's delta
// for it, and every other key is tried. Parked keys that are due are
// tried in batches of their own, chunk by chunk in savepoints.
func (f *Flusher) plan(fields map[string]int64, moves []counter.Move, prior []state.Carried) ([]*attemptBatch, *outcome, error) {
	out := &outcome{applied: map[string]int64{}}
	carried, err := moveCarried(prior, moves)
	if err != nil {
		return nil, nil, err
	}
	return f.planMoved(fields, carried, out)
}

// runMoves runs a batch's lifecycle moves on carried deltas and returns
// what is carried after them.
func runMoves(prior []state.Carried, moves []counter.Move) ([]state.Carried, error) {
	carried, err := moveCarried(prior, moves)
	if err != nil {
		return nil, err
	}
	out := make([]state.Carried, 0, len(carried))
	for _, c := range carried {
		if c.Delta != 0 {
			out = append(out, *c)
		}
	}
	return out, nil
}

// moveCarried runs moves on the carried deltas prior (changing its
// entries) and returns them by field.
func moveCarried(prior []state.Carried, moves []counter.Move) (map[string]*state.Carried, error) {
	carried := make(map[string]*state.Carried, len(prior))
	for i := range prior {
		c := &prior[i]
		carried[counter.Field(c.Counter, c.Key)] = c
	}
	for _, m := range moves {
		c := carried[m.Field]
		if c == nil {
			continue
		}
		delete(carried, m.Field)
		if m.To == "" {
			continue // the row was deleted: its deltas go with it
		}
		name, key, ok := counter.SplitField(m.To)
		if !ok {
			return nil, fmt.Errorf("carry deltas: malformed move to %q", m.To)
		}
		if to := carried[m.To]; to != nil {
			to.Delta += c.Delta
			if c.Since.Before(to.Since) {
				to.Since = c.Since
			}
			continue
		}
		c.Counter, c.Key = name, key
		carried[m.To] = c
	}
	return carried, nil
}

// planMoved is plan after the moves ran on the carried deltas.
func (f *Flusher) planMoved(fields map[string]int64, carried map[string]*state.Carried, out *outcome) ([]*attemptBatch, *outcome, error) {
	normal := make(map[string]int64, len(fields)+len(carried))
	retry := map[string]int64{}
	for field, n := range fields {
		if n != 0 {
			normal[field] = n
		}
	}
	f.prior = make(map[string]state.Carried, len(carried))
	for field, c := range carried {
		if c.Parked != "" && !c.Due {
			c.Delta += normal[field]
			delete(normal, field)
			if c.Delta != 0 {
				out.carry = append(out.carry, *c)
			}
			continue
		}
		f.prior[field] = *c
		if c.Parked != "" {
			retry[field] = c.Delta + normal[field]
			delete(normal, field)
			if retry[field] == 0 {
				delete(retry, field)
			}
			continue
		}
		if normal[field] += c.Delta; normal[field] == 0 {
			delete(normal, field)
		}
	}
	var batches []*attemptBatch
	for _, set := range []struct {
		fields  map[string]int64
		careful bool
	}{{normal, false}, {retry, true}} {
		bs, err := f.group(set.fields)
		if err != nil {
			return nil, nil, err
		}
		for _, b := range bs {
			batches = append(batches, &attemptBatch{counterBatch: b, careful: set.careful})
		}
	}
	return batches, out, nil
}
