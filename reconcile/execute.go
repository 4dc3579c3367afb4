package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/state"
)

// runPending claims and executes every pending or interrupted run, oldest
// first, while this daemon streams.
func (r *Reconciler) runPending(ctx context.Context) error {
	for ctx.Err() == nil && r.streaming() {
		// The daemon that streams takes over a run a daemon that lost
		// the slot held (state.Runs.Claim).
		run, ok, err := r.runs.Claim(ctx, r.opt.Owner, r.opt.Lease, r.opt.Streaming != nil)
		if err != nil || !ok {
			return err
		}
		if err := r.execute(ctx, run); err != nil {
			if errors.Is(err, state.ErrLeaseLost) {
				r.log.Warn("another walcount took the reconciliation run over", zap.Int64("run", run.ID))
				r.finish(run)
				continue
			}
			return err
		}
	}
	return nil
}

// execute runs one reconciliation to its end, saving progress after
// every batch.
func (r *Reconciler) execute(ctx context.Context, run RunInfo) error {
	start := time.Now()
	resumed := run.Status == state.StatusRunning
	// A count through row-level security that hides rows is a count of
	// what the policies let through: refuse before anything is measured
	// or written (docs/design.md, "Row-level security").
	for _, name := range run.Counters {
		if c, ok := r.counter(name); ok {
			if err := counter.CheckRowViews(ctx, r.opt.Pool, c); err != nil {
				if ctx.Err() != nil {
					return nil // resumes after restart
				}
				if run.Kind == state.KindBackfill && errors.Is(err, counter.ErrPartialView) {
					r.backfillHidden = true
				}
				return r.fail(ctx, run, err)
			}
		}
	}
	run.Status = state.StatusRunning
	if !resumed && run.Keys != nil {
		run.Total = int64(len(run.Keys))
	} else if !resumed {
		run.Total = 0
		for _, name := range run.Counters {
			if c, ok := r.counter(name); ok {
				sql, err := counter.Resolve(ctx, r.opt.Pool, c)
				if err != nil {
					return r.fail(ctx, run, err)
				}
				var n int64
				if err := r.opt.Pool.QueryRow(ctx, sql.Total).Scan(&n); err != nil {
					return r.fail(ctx, run, fmt.Errorf("count target rows: %w", err))
				}
				run.Total += n
			}
		}
	}
	r.setCurrent(&run)
	r.log.Info("reconciliation started", zap.Int64("run", run.ID), zap.String("kind", run.Kind),
		zap.Strings("counters", run.Counters), zap.Bool("dry_run", run.DryRun), zap.Bool("resumed", resumed),
		zap.Int64("total_keys", run.Total))
	if err := r.runs.Progress(ctx, run, r.opt.Lease); err != nil {
		return err
	}
	startIdx := 0
	if run.CurCounter != "" {
		if i := slices.Index(run.Counters, run.CurCounter); i >= 0 {
			startIdx = i
		}
	}
	for _, name := range run.Counters[startIdx:] {
		c, ok := r.counter(name)
		if !ok {
			return r.fail(ctx, run, fmt.Errorf("%w: %q is not configured any more", ErrUnknownCounter, name))
		}
		if run.CurCounter != name {
			run.CurCounter, run.LastKey = name, ""
		} else if err := r.remeasureChanged(ctx, &run, c); err != nil {
			return r.fail(ctx, run, err)
		}
		if err := r.reconcileCounter(ctx, &run, c); err != nil {
			if ctx.Err() != nil {
				return nil // resumes after restart
			}
			if errors.Is(err, state.ErrLeaseLost) || errors.Is(err, failpoint.ErrCrash) {
				return err
			}
			return r.fail(ctx, run, err)
		}
		if run.Kind == state.KindBackfill && !run.DryRun {
			if err := r.runs.Backfilled(ctx, c); err != nil {
				return r.fail(ctx, run, err)
			}
		}
	}
	run.Status = state.StatusDone
	now := time.Now()
	run.FinishedAt = &now
	if err := r.runs.Progress(ctx, run, r.opt.Lease); err != nil {
		return err
	}
	if len(run.DirtyIDs) > 0 && !run.DryRun {
		if err := state.ClearDirty(ctx, r.opt.Pool, run.DirtyIDs); err != nil {
			return err
		}
		r.log.Info("dirty counter repaired", zap.Strings("counters", run.Counters), zap.Int64("corrected", run.Corrected))
	}
	r.finish(run)
	r.prune(ctx)
	r.log.Info("reconciliation done", zap.Int64("run", run.ID), zap.Int64("keys_checked", run.KeysChecked),
		zap.Int64("drifted", run.Drifted), zap.Int64("corrected", run.Corrected), zap.Duration("took_seconds", time.Since(start)))
	return nil
}

// remeasureChanged starts the counter a resumed backfill stopped in over
// from its first key when the counter's definition changed since the
// backfill was queued: the keys measured before the stop were measured
// with the old definition, and the backfill's end records the new one as
// backfilled.
func (r *Reconciler) remeasureChanged(ctx context.Context, run *RunInfo, c counter.Counter) error {
	if run.Kind != state.KindBackfill || run.LastKey == "" {
		return nil
	}
	changed, err := r.runs.DefinitionChanged(ctx, c)
	if err != nil || !changed {
		return err
	}
	r.log.Info("the counter's definition changed since its backfill began: the backfill measures it again from its first key",
		zap.Int64("run", run.ID), zap.String("counter", c.Name), zap.String("stopped_after_key", run.LastKey))
	run.LastKey = ""
	return nil
}

func (r *Reconciler) fail(ctx context.Context, run RunInfo, err error) error {
	if ctx.Err() != nil {
		// The daemon stops (SIGTERM): whatever failed failed because of
		// it. The run stays unfinished, and the walcount that streams
		// next resumes it (Release hands it over).
		r.log.Info("reconciliation interrupted; it resumes when a walcount of the slot streams again",
			zap.Int64("run", run.ID), zap.NamedError("cause", err))
		r.mu.Lock()
		r.current = nil
		r.mu.Unlock()
		return nil
	}
	run.Status = state.StatusFailed
	run.Error = err.Error()
	now := time.Now()
	run.FinishedAt = &now
	if perr := r.runs.Progress(context.WithoutCancel(ctx), run, r.opt.Lease); perr != nil {
		r.log.Error("save failed run", zap.Error(perr))
	}
	r.finish(run)
	r.prune(context.WithoutCancel(ctx))
	return fmt.Errorf("reconcile run %d: %w", run.ID, err)
}

// setCurrent publishes a copy of run: execute keeps changing its own.
func (r *Reconciler) setCurrent(run *RunInfo) {
	c := *run
	r.mu.Lock()
	r.current = &c
	r.mu.Unlock()
}

func (r *Reconciler) update(run *RunInfo, drift []KeyDrift) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil {
		return
	}
	d := r.current.Drift
	for _, k := range drift {
		if len(d) < state.MaxDriftSamples {
			d = append(d, k)
		}
	}
	run.Drift = d
	*r.current = *run
}

// prune keeps the slot's newest state.KeptRuns finished runs and deletes
// the older ones; a failure only costs a longer table until the next run.
func (r *Reconciler) prune(ctx context.Context) {
	if n, err := r.runs.Prune(ctx, state.KeptRuns); err != nil {
		r.log.Warn("could not prune old reconciliation runs", zap.Error(err))
	} else if n > 0 {
		r.log.Debug("pruned old reconciliation runs", zap.Int64("deleted", n), zap.Int("kept", state.KeptRuns))
	}
}

func (r *Reconciler) finish(run RunInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.rates, run.ID)
	if r.current != nil {
		run.Drift = r.current.Drift
	}
	r.current = nil
	r.last = &run
}
