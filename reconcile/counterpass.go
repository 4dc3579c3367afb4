package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// reconcileCounter walks c's keys (all of them, or the run's) in key
// order, in rounds (see pass).
func (r *Reconciler) reconcileCounter(ctx context.Context, run *RunInfo, c counter.Counter) error {
	sql, err := counter.Resolve(ctx, r.opt.Pool, c)
	if err != nil {
		return err
	}
	io := &reconcilerIO{r: r, sql: sql, quiet: quietAbove(run, c)}
	p := &pass{
		io:      io,
		log:     r.log,
		counter: c.Name,
		dry:     run.DryRun,
		size:    run.BatchSize,
		pacer:   NewPacer(r.rate(run.ID), r.opt.Clock),
		keys:    run.Keys,
		run:     run,
	}
	if p.size <= 0 {
		p.size = r.opt.BatchSize
	}
	if run.Keys == nil {
		p.sv = newSurvey(sql, r.opt.Slot)
		if c.IsVia() && !run.DryRun {
			// A full run measures the via rows there are: every parent
			// gets one first (counter.ViaSeedSQL).
			tag, err := r.opt.Pool.Exec(ctx, counter.ViaSeedSQL(c))
			if err != nil {
				return fmt.Errorf("counter %s: seed its via table: %w", c.Name, err)
			}
			if n := tag.RowsAffected(); n > 0 {
				r.log.Info("via rows seeded", zap.Int64("run", run.ID), zap.String("counter", c.Name), zap.Int64("rows", n))
			}
		}
		if sql.Seed != "" && !run.DryRun {
			if err := r.seedTargets(ctx, run, sql); err != nil {
				return err
			}
		}
	}
	p.backfill = run.Kind == state.KindBackfill
	checked, corrected := run.KeysChecked, run.Corrected
	if err := p.execute(ctx); err != nil {
		return err
	}
	if err := r.markUnsettled(ctx, run, c, p.unsettled); err != nil {
		return err
	}
	// One line per counter: a backfill's corrections are its first count,
	// a reconcile's are drift (WARN when it found any).
	fields := []zap.Field{zap.Int64("run", run.ID), zap.String("counter", c.Name),
		zap.Int64("keys_checked", run.KeysChecked-checked), zap.Int64("corrected", run.Corrected-corrected)}
	switch {
	case p.backfill:
		r.log.Info("counter backfilled", fields...)
	case run.Corrected > corrected:
		r.log.Warn("counter reconciled", append(fields, zap.Int64("not_logged", p.notLogged))...)
	default:
		r.log.Info("counter reconciled", fields...)
	}
	return nil
}

// markUnsettled marks dirty the keys of c whose measurements kept
// disagreeing in run's pass: neither corrected nor known exact, they are
// left to a later repair rather than taken for exact when the run ends.
func (r *Reconciler) markUnsettled(ctx context.Context, run *RunInfo, c counter.Counter, keys []string) error {
	if len(keys) == 0 || run.DryRun {
		return nil
	}
	tx, err := r.opt.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("counter %s: mark unsettled keys dirty: %w", c.Name, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	cause := fmt.Sprintf("reconciliation run %d of counter %s could not settle these keys: their measurements kept disagreeing", run.ID, c.Name)
	if err := state.MarkDirty(ctx, tx, r.opt.Slot, c.Name, keys, cause); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("counter %s: mark unsettled keys dirty: %w", c.Name, err)
	}
	return nil
}

// maxSeedMarks is how many target rows one seed may create before the
// other counters of the target are marked dirty whole instead of key by
// key.
const maxSeedMarks = 10000

// seedTargets gives every key of the create_missing counter sql with
// counted source rows a target row when it has none (counter's
// Resolved.Seed), so that the full run that follows measures it and sets
// its column: without it a key whose source rows predate the counter (or
// whose row the app deleted, or a TRUNCATE emptied) would get no row
// until its rows change again. In the same transaction every counter of
// the target sets its column in the created rows from its source rows
// (Resolved.Fill), so that a created row is never seen with a value its
// rows do not give: the backfill orders this counter after what the
// target's other counters are computed from (dependsOn). The deltas of
// changes that committed before the seed but were not flushed yet may
// still reach the created rows: the measurement that follows corrects the
// seeding counter's column, and the other counters of the target are
// marked dirty for those keys in the same transaction (the whole counter
// past maxSeedMarks), so that their repair measures them.
func (r *Reconciler) seedTargets(ctx context.Context, run *RunInfo, sql *counter.Resolved) error {
	c := sql.Counter
	tx, err := r.opt.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(ctx, sql.Seed, sql.FilterArgs...)
	if err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	if len(keys) == 0 {
		return nil
	}
	marks := keys
	if len(keys) > maxSeedMarks {
		marks = nil
	}
	cause := fmt.Sprintf("reconciliation of counter %s created target rows for keys with source rows and no row", c.Name)
	for _, o := range r.opt.Counters {
		if o.Target != c.Target || o.IsVia() {
			continue
		}
		if err := fillSeeded(ctx, tx, o, keys); err != nil {
			return fmt.Errorf("counter %s: create missing target rows: fill counter %s: %w", c.Name, o.Name, err)
		}
		if o.Name == c.Name {
			continue
		}
		if err := state.MarkDirty(ctx, tx, r.opt.Slot, o.Name, marks, cause); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	r.log.Info("target rows created", zap.Int64("run", run.ID), zap.String("counter", c.Name), zap.Int("rows", len(keys)))
	return nil
}

// fillChunk is how many created rows one Fill statement sets.
const fillChunk = 5000

// fillSeeded sets counter o's column in the target rows of keys, which tx
// created, from o's source rows (Resolved.Fill).
func fillSeeded(ctx context.Context, tx pgx.Tx, o counter.Counter, keys []string) error {
	sql, err := counter.Resolve(ctx, tx, o)
	if err != nil {
		return err
	}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), fillChunk)]
		keys = keys[len(chunk):]
		if _, err := tx.Exec(ctx, sql.Fill, append([]any{chunk}, sql.FilterArgs...)...); err != nil {
			return err
		}
	}
	return nil
}

// reconcilerIO is a pass's way to the stream and the database.
type reconcilerIO struct {
	r   *Reconciler
	sql *counter.Resolved
	// quiet names the level above a via counter that this backfill
	// measures after it: the via counter's corrections are then written
	// into the via table quietly (correctVia).
	quiet string
}

var _ passIO = (*reconcilerIO)(nil)

func (io *reconcilerIO) measure(ctx context.Context, rq *roundRequest) (roundResult, error) {
	return io.r.measureRetrying(ctx, io.sql, rq)
}

func (io *reconcilerIO) emit(ctx context.Context, drift []KeyDrift) (cdc.LSN, error) {
	if io.quiet != "" {
		return io.r.correctVia(ctx, io.sql, io.quiet, drift)
	}
	return io.r.emitCorrections(ctx, drift)
}

func (io *reconcilerIO) applied(ctx context.Context, lsn cdc.LSN) error {
	return io.r.waitCheckpoint(ctx, lsn, nil)
}

func (io *reconcilerIO) progress(ctx context.Context, run *RunInfo, drift []KeyDrift) error {
	io.r.update(run, drift)
	return io.r.runs.Progress(ctx, *run, io.r.opt.Lease)
}

func (io *reconcilerIO) checked(keys, corrected int) {
	name := io.sql.Counter.Name
	if keys > 0 {
		io.r.opt.Metrics.ReconcileKeysChecked.WithLabelValues(name).Add(float64(keys))
	}
	if corrected > 0 {
		io.r.opt.Metrics.ReconcileCorrections.WithLabelValues(name).Add(float64(corrected))
		io.r.opt.Tally.Add(name, counter.TallyCorrections, int64(corrected))
	}
}

func (io *reconcilerIO) idle(ctx context.Context) { io.r.pace(ctx) }

// pace waits while the stream is behind, so reconciliation never starves
// it.
func (r *Reconciler) pace(ctx context.Context) {
	if r.opt.Busy == nil {
		return
	}
	for i := 0; i < 50 && r.opt.Busy(); i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
