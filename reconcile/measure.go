package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/state"
)

// roundRequest is what one measurement reads, all in one snapshot: a
// range of target keys by a survey, keys one by one, or both.
type roundRequest struct {
	// survey, when set, reads up to limit target keys after after.
	survey *survey
	after  string
	limit  int
	// keys are read one by one: true value and column.
	keys []string
}

// roundResult is what one measurement found.
type roundResult struct {
	surveyed surveyed
	// truth and column of keys; column holds only the keys that have a
	// target row in the snapshot.
	truth, column map[string]int64
	// pending(k) of every key with one (see Recorder), and the keys whose
	// buffered deltas a target lifecycle event moved during the
	// measurement.
	pending map[string]int64
	moved   map[string]bool
	// ws is W as the snapshot saw it: past the measurement's M0, and so
	// past everything emitted before it.
	ws cdc.LSN
	// recompute is set for a max or min counter: its deltas are not
	// amounts but recomputes to come (see aggregator's add), and its
	// truth and column are hashes of the value. A key with pending(k) ≠ 0
	// is set from the source rows by a flush whose snapshot sees at least
	// every pending transaction, whatever its column holds now: it is not
	// off. Any other key is off when its column differs from its truth.
	recompute bool
}

// correction returns correction(k) = truth(k) − column(k) − pending(k) of
// a key read one by one, and whether k has a target row.
func (res *roundResult) correction(k string) (corr, cached int64, ok bool) {
	col, ok := res.column[k]
	if !ok {
		return 0, 0, false
	}
	corr, cached = res.off(k, res.truth[k], col)
	return corr, cached, true
}

// off returns the correction of key k whose true value and column in the
// snapshot are truth and column, and the value cached: the column with
// the deltas on their way. A max or min key with recomputes on their way
// needs none (see recompute).
func (res *roundResult) off(k string, truth, column int64) (corr, cached int64) {
	if res.recompute {
		if res.pending[k] != 0 {
			return 0, column
		}
		return truth - column, column
	}
	cached = column + res.pending[k]
	return truth - cached, cached
}

// measureRetrying repeats a measurement that a session restart or a
// timeout interrupted. A measurement that recorded too many changes is
// repeated over half the range. rq.limit holds the limit that succeeded.
func (r *Reconciler) measureRetrying(ctx context.Context, sql *counter.Resolved, rq *roundRequest) (roundResult, error) {
	var err error
	for attempt := 1; attempt <= DefaultMaxAttempts; attempt++ {
		var res roundResult
		res, err = r.measure(ctx, sql, rq)
		if err == nil || ctx.Err() != nil || errors.Is(err, counter.ErrPartialView) || errors.Is(err, failpoint.ErrCrash) {
			return res, err
		}
		if errors.Is(err, errTooManyChanges) && rq.survey != nil && rq.limit > 1 {
			rq.limit /= 2
		}
		r.log.Debug("measurement interrupted; measuring again", zap.Error(err), zap.Int("attempt", attempt))
		select {
		case <-ctx.Done():
			return roundResult{}, ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	return roundResult{}, fmt.Errorf("measure %s: gave up after %d attempts: %w", sql.Counter.Name, DefaultMaxAttempts, err)
}

// measure runs one bracketed measurement (see the package documentation).
func (r *Reconciler) measure(ctx context.Context, sql *counter.Resolved, rq *roundRequest) (roundResult, error) {
	r.seq++
	m := &measurement{
		id:      strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(r.seq, 10),
		counter: sql.Counter.Name,
	}
	r.rec.register(m)
	defer r.rec.unregister(m)
	var took [4]time.Duration // M0 in the stream, W past it, reads, M1
	start := time.Now()
	lap := func(i int) {
		took[i] = time.Since(start)
		start = time.Now()
	}

	// 1. M0, and wait until its transaction committed in the stream.
	if err := cdc.PostMessage(ctx, r.opt.Pool, r.markerJSON(m.id, 0)); err != nil {
		return roundResult{}, err
	}
	if err := r.wait(ctx, m.committed, m.done, "marker M0 in the stream"); err != nil {
		return roundResult{}, err
	}
	lap(0)
	// 2. W past M0.
	if err := r.waitCheckpoint(ctx, m.m0End, m.done); err != nil {
		return roundResult{}, err
	}
	lap(1)
	// 3. Truth, column, W and the snapshot, all in one snapshot.
	snap, ws, res, err := r.read(ctx, sql, rq)
	if err != nil {
		return roundResult{}, err
	}
	lap(2)
	r.rec.setSnapshot(m, snap, ws)
	// 4. M1; the recorder computes pending(k) when it arrives.
	if err := cdc.PostMessage(ctx, r.opt.Pool, r.markerJSON(m.id, 1)); err != nil {
		return roundResult{}, err
	}
	if err := r.wait(ctx, m.done, nil, "marker M1 in the stream"); err != nil {
		return roundResult{}, err
	}
	if m.err != nil {
		return roundResult{}, m.err
	}
	lap(3)
	if err := r.opt.Failpoints.Inject(failpoint.AfterMeasure); err != nil {
		return roundResult{}, err
	}
	res.pending, res.moved, res.ws, res.recompute = m.pending, m.moved, ws, sql.Extremum
	r.log.Debug("measured", zap.String("counter", m.counter), zap.Int64("range_keys", res.surveyed.n),
		zap.Int("range_off", len(res.surveyed.off)), zap.Int("keys", len(rq.keys)), zap.Int("pending", len(res.pending)),
		zap.Duration("m0_seconds", took[0]), zap.Duration("checkpoint_seconds", took[1]), zap.Duration("read_seconds", took[2]), zap.Duration("m1_seconds", took[3]))
	return res, nil
}

func (r *Reconciler) markerJSON(id string, phase int) string {
	return fmt.Sprintf(`{"reconcile":%q,"phase":%d,"slot":%q}`, id, phase, r.opt.Slot)
}

// wait waits for ch, failing early when failed closes (the measurement
// ended with an error).
func (r *Reconciler) wait(ctx context.Context, ch, failed <-chan struct{}, what string) error {
	stall := r.stallTimer()
	t := time.NewTicker(min(r.opt.StepTimeout, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ch:
			return nil
		case <-failed:
			return errSessionRestarted
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if stall() {
				return fmt.Errorf("timed out after %s without progress of the stream waiting for %s", r.opt.StepTimeout, what)
			}
		}
	}
}

// stallTimer returns a function that reports whether StepTimeout passed
// since the stream last moved (Options.Progress), or since the call when
// there is no Progress.
func (r *Reconciler) stallTimer() func() bool {
	var last cdc.LSN
	if r.opt.Progress != nil {
		last = r.opt.Progress()
	}
	deadline := time.Now().Add(r.opt.StepTimeout)
	return func() bool {
		if r.opt.Progress != nil {
			if cur := r.opt.Progress(); cur != last {
				last = cur
				deadline = time.Now().Add(r.opt.StepTimeout)
			}
		}
		return time.Now().After(deadline)
	}
}

// waitCheckpoint flushes until W reaches lsn.
func (r *Reconciler) waitCheckpoint(ctx context.Context, lsn cdc.LSN, failed <-chan struct{}) error {
	stall := r.stallTimer()
	for {
		w, err := state.ReadCheckpoint(ctx, r.opt.Pool, r.opt.Slot)
		if err != nil {
			return err
		}
		if w >= lsn {
			return nil
		}
		if stall() {
			return fmt.Errorf("timed out after %s without progress of the stream waiting for the checkpoint to pass %s (at %s)", r.opt.StepTimeout, lsn, w)
		}
		if r.opt.Flush != nil {
			if err := r.opt.Flush(ctx); err != nil && !errors.Is(err, ErrNotStreaming) {
				return err
			}
		}
		select {
		case <-failed:
			return errSessionRestarted
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// read takes the snapshot S and reads W_S, the survey and the keys in it.
func (r *Reconciler) read(ctx context.Context, sql *counter.Resolved, rq *roundRequest) (Snapshot, cdc.LSN, roundResult, error) {
	var snap Snapshot
	var ws cdc.LSN
	res := roundResult{truth: make(map[string]int64, len(rq.keys)), column: make(map[string]int64, len(rq.keys))}
	err := pgx.BeginTxFunc(ctx, r.opt.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		s, w, err := state.SnapshotCheckpoint(ctx, tx, r.opt.Slot)
		if err != nil {
			return err
		}
		ws = w
		if snap, err = ParseSnapshot(s); err != nil {
			return err
		}
		if err := guardRowSecurity(ctx, tx, sql.Counter); err != nil {
			return err
		}
		if rq.survey != nil {
			// A survey's statements are short and cheap for their plan's
			// cost: compiling them would cost more than running them.
			if _, err := tx.Exec(ctx, "SET LOCAL jit = off"); err != nil {
				return err
			}
			if res.surveyed, err = rq.survey.read(ctx, tx, rq.after, rq.limit); err != nil {
				return err
			}
		}
		if len(rq.keys) == 0 {
			return nil
		}
		if err := collect(ctx, tx, sql.Truth, append([]any{rq.keys}, sql.FilterArgs...), res.truth); err != nil {
			return fmt.Errorf("read true values: %w", err)
		}
		if err := collect(ctx, tx, sql.Column, []any{rq.keys, r.opt.Slot}, res.column); err != nil {
			return fmt.Errorf("read counter column: %w", err)
		}
		return nil
	})
	if err != nil && hiddenByPolicy(err) {
		err = fmt.Errorf("counter %s: %w: %v", sql.Counter.Name, counter.ErrPartialView, err)
	}
	return snap, ws, res, err
}

// guardRowSecurity refuses a measurement that row-level security would
// make partial: the counts would be those of the rows walcount's role sees.
// When no policy applies to the role at all (the usual case: it owns the
// tables or has BYPASSRLS, or they have none), it also sets row_security
// off for the transaction, so that a policy enabled after this check makes
// the reads fail instead of count less. A role that sees every row through
// a policy USING (true) cannot have that guard: with row_security off,
// PostgreSQL refuses any read that a policy applies to.
func guardRowSecurity(ctx context.Context, tx pgx.Tx, c counter.Counter) error {
	if err := counter.CheckRowViews(ctx, tx, c); err != nil {
		return err
	}
	none, err := counter.NoRowSecurity(ctx, tx, c)
	if err != nil || !none {
		return err
	}
	_, err = tx.Exec(ctx, "SET LOCAL row_security = off")
	return err
}

// hiddenByPolicy reports whether err is PostgreSQL refusing a read under
// row_security = off because a policy applies to it.
func hiddenByPolicy(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501" && strings.Contains(pgErr.Message, "row-level security")
}

func collect(ctx context.Context, tx pgx.Tx, query string, args []any, into map[string]int64) error {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	var k string
	var v *int64
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error {
		// NULL: a max or min key with a recompute carried, not measured
		// (counter.Resolved.Column).
		if v != nil {
			into[k] = *v
		}
		return nil
	})
	return err
}
