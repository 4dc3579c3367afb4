package sink

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// carry writes the keys carried after this flush, and a dirty mark for
// each key parked for the first time (design rule 14: reconciliation
// repairs it once it can be written).
func (f *Flusher) carry(ctx context.Context, tx pgx.Tx, out *outcome, loaded []state.Carried) error {
	if err := state.UpdateCarried(ctx, tx, f.opt.Slot, loaded, out.carry, f.opt.ParkRetry); err != nil {
		return err
	}
	byCounter := map[string][]string{}
	causes := map[string]string{}
	for _, p := range out.parked {
		if p.newly {
			byCounter[p.counter] = append(byCounter[p.counter], p.key)
			causes[p.counter] = p.err
		}
	}
	for name, keys := range byCounter {
		cause := "a flush could not write the key: " + causes[name]
		if err := state.MarkDirty(ctx, tx, f.opt.Slot, name, keys, cause); err != nil {
			return err
		}
	}
	// A count that starts a created row below zero proves the source
	// holds rows of the key that no row counted (rows older than the
	// counter's backfill, or than the app's delete of the target row):
	// the row is created, and its key is marked dirty for every
	// create_missing counter of the target in the same transaction, so
	// that reconciliation sets each of its columns to the true value.
	created := map[string]bool{}
	for _, c := range out.created {
		if t := f.targets[c.counter]; t != nil {
			created[t.Counter.Target+"\x00"+c.key] = true
		}
	}
	short := map[string][]string{}
	var names []string
	for field, n := range out.applied {
		name, key, _ := counter.SplitField(field)
		t := f.targets[name]
		if n >= 0 || t == nil || t.Counter.Sum != "" || out.missed[field] || !created[t.Counter.Target+"\x00"+key] {
			continue
		}
		for _, o := range f.targets {
			if !o.Counter.CreateMissing || o.Counter.Target != t.Counter.Target || slices.Contains(short[o.Counter.Name], key) {
				continue
			}
			if _, seen := short[o.Counter.Name]; !seen {
				names = append(names, o.Counter.Name)
			}
			short[o.Counter.Name] = append(short[o.Counter.Name], key)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		slices.Sort(short[name])
		cause := "a flush created the target row with a negative count: the source has rows of the key that walcount never counted"
		if err := state.MarkDirty(ctx, tx, f.opt.Slot, name, short[name], cause); err != nil {
			return err
		}
	}
	return nil
}

// markInheritedMoves marks both ends of each lifecycle move of a batch an
// earlier session buffered dirty (see Inherit).
func (f *Flusher) markInheritedMoves(ctx context.Context, tx pgx.Tx, moves []counter.Move) error {
	byCounter := map[string][]string{}
	var names []string
	for _, m := range moves {
		for _, field := range []string{m.Field, m.To} {
			name, key, ok := counter.SplitField(field)
			if !ok {
				continue // "": the row was deleted
			}
			if _, seen := byCounter[name]; !seen {
				names = append(names, name)
			}
			if !slices.Contains(byCounter[name], key) {
				byCounter[name] = append(byCounter[name], key)
			}
		}
	}
	for _, name := range names {
		const cause = "a target row changed after a flush that walcount restarted before following"
		if err := state.MarkDirty(ctx, tx, f.opt.Slot, name, byCounter[name], cause); err != nil {
			return err
		}
		f.log.Warn("keys marked dirty: a target row was deleted or re-keyed in what an earlier session buffered, which may have crossed one of its flushes; reconciliation will measure them",
			zap.String("counter", name), zap.Int("keys", len(byCounter[name])))
	}
	return nil
}

// committedCarry counts what a committed flush applied and logs what it
// parked.
func (f *Flusher) committedCarry(out *outcome) {
	for _, c := range out.counts {
		f.opt.Metrics.DeltasFlushed.WithLabelValues(c.counter).Add(float64(c.flushed))
		if c.extremum {
			f.opt.Metrics.ExtremumRecomputes.WithLabelValues(c.counter).Add(float64(c.flushed))
		}
		f.opt.Tally.Add(c.counter, counter.TallyFlushed, c.flushed)
		if c.dropped > 0 {
			// The target rows went away; the Rails buffer pattern drops
			// these deltas too.
			f.opt.Metrics.DeltasDropped.WithLabelValues(c.counter).Add(float64(c.dropped))
			f.opt.Tally.Add(c.counter, counter.TallyDropped, c.dropped)
		}
	}
	for _, c := range out.created {
		f.opt.Metrics.TargetRowsCreated.WithLabelValues(c.counter).Inc()
	}
	for _, p := range out.parked {
		if p.newly {
			f.log.Error("a counter key cannot be written and is parked: the other keys go on; it is retried every "+f.opt.ParkRetry.String()+
				" and repaired by reconciliation once it can be written",
				zap.String("counter", p.counter), zap.String("key", p.key), zap.Int64("delta", p.delta), zap.String("error", p.err))
		} else {
			f.log.Warn("a parked counter key still cannot be written",
				zap.String("counter", p.counter), zap.String("key", p.key), zap.Int64("delta", p.delta), zap.String("error", p.err))
		}
	}
	for field, p := range f.prior {
		if _, ok := out.applied[field]; !ok || out.missed[field] {
			continue
		}
		// A carried delta's transactions committed before it was first
		// carried: the time since is a lower bound of their apply lag,
		// which the freshness figures must show.
		f.opt.Metrics.ApplyLag.Observe(max(time.Since(p.Since), 0).Seconds())
		if p.Parked != "" {
			f.log.Info("a parked counter key was written", zap.String("counter", p.Counter), zap.String("key", p.Key))
		}
	}
}
