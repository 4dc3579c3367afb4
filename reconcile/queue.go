package reconcile

import (
	"context"
	"errors"
	"slices"

	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// queueDirty queues the repair of dirty counters that can be kept again:
// one run per counter, over its dirty keys, or all its keys when the whole
// counter is dirty. The run clears the marks it was made for once done.
func (r *Reconciler) queueDirty(ctx context.Context) error {
	marks, err := state.ListDirty(ctx, r.opt.Pool, r.opt.Slot)
	if err != nil || len(marks) == 0 {
		return err
	}
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		return err // one run at a time; the marks wait for the next turn
	}
	type repair struct {
		all  bool
		keys []string
		ids  []int64
	}
	by := map[string]*repair{}
	var order []string
	hidden := map[string]bool{} // by counter, read once per call
	for _, m := range marks {
		if _, ok := r.counter(m.Counter); !ok {
			// The counter left the configuration: nothing to repair.
			if err := state.ClearDirty(ctx, r.opt.Pool, []int64{m.ID}); err != nil {
				return err
			}
			continue
		}
		if r.opt.Keepable != nil && !r.opt.Keepable(m.Counter) {
			continue
		}
		h, read := hidden[m.Counter]
		if !read {
			if h, err = r.hidden(ctx, m.Counter); err != nil {
				return err
			}
			hidden[m.Counter] = h
		}
		if h {
			continue // stays dirty, and listed as such, until its rows can be seen
		}
		rp := by[m.Counter]
		if rp == nil {
			rp = &repair{}
			by[m.Counter] = rp
			order = append(order, m.Counter)
		}
		rp.ids = append(rp.ids, m.ID)
		if m.Key == nil {
			rp.all = true
		} else if !slices.Contains(rp.keys, *m.Key) {
			rp.keys = append(rp.keys, *m.Key)
		}
	}
	for _, name := range order {
		rp := by[name]
		run := RunInfo{Kind: state.KindDirty, Counters: []string{name}, BatchSize: r.opt.BatchSize, DirtyIDs: rp.ids}
		if !rp.all {
			slices.Sort(rp.keys)
			run.Keys = rp.keys
		}
		if _, err := r.runs.CreateFor(ctx, run); err != nil {
			return err
		}
		r.log.Info("repairing a dirty counter", zap.String("counter", name), zap.Bool("every_key", rp.all), zap.Int("keys", len(rp.keys)))
	}
	return nil
}

// hidden reports whether row-level security hides rows of the counter's
// tables from walcount's role. It logs why the first time it does, and
// again only after they could be seen meanwhile.
func (r *Reconciler) hidden(ctx context.Context, name string) (bool, error) {
	c, _ := r.counter(name)
	err := counter.CheckRowViews(ctx, r.opt.Pool, c)
	if err == nil {
		delete(r.unseen, name)
		return false, nil
	}
	if !errors.Is(err, counter.ErrPartialView) {
		return false, err
	}
	if !r.unseen[name] {
		r.unseen[name] = true
		r.log.Warn("a dirty counter is not repaired: row-level security hides rows of its tables from walcount's role, so no correction can be measured; it stays dirty",
			zap.String("counter", name), zap.Error(err))
	}
	return true, nil
}

// forget deletes what the slot keeps for counters that left the
// configuration (state.Runs.Forget), once, before their backfill records
// could make a counter added back look backfilled. Only the daemon that
// streams forgets: a standby started with a new configuration must not
// delete the carried deltas of counters the active daemon still keeps.
// It reports whether it forgot a backfill record the backfill that ran
// before it may have read.
func (r *Reconciler) forget(ctx context.Context) bool {
	forgot, err := r.runs.Forget(ctx, r.opt.Pool, r.names())
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("cannot forget the counters removed from the configuration; trying again", zap.Error(err))
		}
		return false
	}
	r.forgotten = true
	if len(forgot) > 0 {
		r.log.Info("forgot the state of counters removed from the configuration (backfill records, dirty marks, partitions, carried deltas)",
			zap.Strings("counters", forgot))
	}
	return len(forgot) > 0
}

// backfill reconciles the counters that are new or changed, so adding
// walcount to a table that already has rows makes the counts exact.
func (r *Reconciler) backfill(ctx context.Context) error {
	names, err := r.runs.NeedBackfill(ctx, r.opt.Counters)
	if err != nil || len(names) == 0 {
		return err
	}
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		// An unfinished run resumes first; the backfill is queued once
		// it is done (Run asks again).
		r.backfillDeferred = err == nil
		return err
	}
	r.backfillDeferred = false
	names = BackfillOrder(r.opt.Counters, names)
	r.log.Info("backfilling new counters", zap.Strings("counters", names))
	var queued []counter.Counter
	for _, name := range names {
		if c, ok := r.counter(name); ok {
			queued = append(queued, c)
		}
	}
	if err := r.runs.BackfillQueued(ctx, queued); err != nil {
		return err
	}
	if _, err := r.runs.Create(ctx, state.KindBackfill, names, false, r.opt.BatchSize); err != nil {
		return err
	}
	return nil
}

// retryBackfill queues the backfill again once row-level security, which
// failed the last one, lets walcount's role see every row of the counters
// that still need it.
func (r *Reconciler) retryBackfill(ctx context.Context) error {
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		return err // one run at a time: ask again at the next poll
	}
	names, err := r.runs.NeedBackfill(ctx, r.opt.Counters)
	if err != nil {
		return err
	}
	for _, name := range names {
		c, _ := r.counter(name)
		if err := counter.CheckRowViews(ctx, r.opt.Pool, c); err != nil {
			if errors.Is(err, counter.ErrPartialView) {
				return nil // still hidden: ask again at the next poll
			}
			return err
		}
	}
	r.backfillHidden = false
	return r.backfill(ctx)
}
