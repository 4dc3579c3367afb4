package sink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/events"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/state"
)

// flushBig flushes a batch of more keys than one transaction may update,
// in bounded pieces. One transaction moves W from h.From to h.Upto, runs
// the batch's moves on the keys carried before, and stages the batch in
// walcount.carried, merged with them, read from Redis page by page and
// copied to the server page by page: it updates no target row, so it holds
// no lock an application waits for, and memory holds a page at a time.
// The counter columns plus walcount.carried then hold every delta up to
// the new W, exactly as after any flush (design rule 2), so a crash at any
// point later loses and doubles nothing. Then drain applies the carried
// keys in short transactions.
func (f *Flusher) flushBig(ctx context.Context, start time.Time, h buffer.Handed) (bool, error) {
	staged, err := f.stage(ctx, h)
	if err != nil {
		f.opt.Metrics.FlushErrors.Inc()
		return false, err
	}
	if staged {
		// Set before end moves W: the staged deltas are not in the
		// columns yet (see lagApplied).
		f.drainDue = true
	}
	if err := f.end(ctx, h.From, h.Upto); err != nil {
		return false, err
	}
	if !staged {
		return true, nil
	}
	pieces, err := f.drainCount(ctx)
	if err != nil {
		f.opt.Metrics.FlushErrors.Inc()
		return false, err
	}
	f.opt.Metrics.Flushes.Inc()
	f.opt.Metrics.FlushDuration.Observe(time.Since(start).Seconds())
	f.log.Info("flushed a big batch in pieces", zap.String("from", h.From.String()), zap.String("upto", h.Upto.String()),
		zap.Int64("keys", h.Deltas), zap.Int("transactions", pieces+1), zap.Duration("took_seconds", time.Since(start)))
	return true, nil
}

// stage is flushBig's first transaction. It reports false when the batch
// had already been committed.
func (f *Flusher) stage(ctx context.Context, h buffer.Handed) (bool, error) {
	// The copy of a big batch may take long, but it locks only the
	// checkpoint row and walcount.carried, which no application waits
	// for.
	tx, err := f.begin(ctx, 0)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	moved, err := state.CompareAndSet(ctx, tx, f.opt.Slot, h.From, h.Upto)
	if err != nil {
		return false, err
	}
	if !moved {
		_ = tx.Rollback(ctx)
		return false, f.alreadyApplied(ctx, h.From, h.Upto)
	}
	if err := state.CreateStage(ctx, tx); err != nil {
		return false, err
	}
	moves, err := f.opt.Buffer.Scan(ctx, h, f.opt.ChunkSize, func(fs []string, ds []int64) error {
		return state.CopyStage(ctx, tx, fs, ds)
	})
	if err != nil {
		return false, err
	}
	// The batch's moves run on the keys carried before it, which are of
	// the rows as they were at W (design rule 2). A drain ran before the
	// hand-over, so these are the keys it could not apply: held rows and
	// parked keys.
	loaded, err := state.LoadCarried(ctx, tx, f.opt.Slot)
	if err != nil {
		return false, err
	}
	carried, err := runMoves(slices.Clone(loaded), moves)
	if err != nil {
		return false, err
	}
	if err := state.UpdateCarried(ctx, tx, f.opt.Slot, loaded, carried, f.opt.ParkRetry); err != nil {
		return false, err
	}
	if h.From < f.inherited {
		if err := f.markInheritedMoves(ctx, tx, moves); err != nil {
			return false, err
		}
	}
	names := make([]string, 0, len(f.targets))
	for name := range f.targets {
		names = append(names, name)
	}
	staged, merged, dropped, err := state.StageCarried(ctx, tx, f.opt.Slot, names)
	if err != nil {
		return false, err
	}
	if staged != h.Deltas {
		return false, fmt.Errorf("hand over redis buffer: %w: read %d of %d flushing deltas", buffer.ErrChainBroken, staged, h.Deltas)
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeCommit); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit flush: %w", err)
	}
	if dropped > 0 {
		f.log.Warn("dropped the deltas of counters no longer configured", zap.Int64("keys", dropped))
	}
	f.log.Info("staged a big batch in walcount.carried; applying it in pieces", zap.String("upto", h.Upto.String()),
		zap.Int64("keys", merged), zap.Int("max_keys_per_transaction", f.opt.TransactionKeys),
		zap.Duration("max_transaction_time", f.opt.TransactionTime), zap.Duration("per_key_seconds", f.pace.perKey))
	return true, nil
}

// drain applies what walcount.carried holds in pieces, each its own
// transaction of at most TransactionKeys keys that stops taking more once
// it has spent TransactionTime updating, in (counter, key) order. A piece
// is a flush without a hand-over: it takes the checkpoint row's lock
// (SELECT … FOR UPDATE where W is still W), applies the carried deltas it can
// lock at once, writes back what it could not (the same rules as every
// flush: deferred, parked), and sends a flush marker for W, because its
// deltas are of the rows as they were at W and it may cross their
// lifecycle events as any flush does (design rule 17). Nothing moves W,
// so a crash between two pieces leaves the columns plus walcount.carried
// exact, and the next session's first flush drains the rest.
func (f *Flusher) drain(ctx context.Context) error {
	_, err := f.drainCount(ctx)
	return err
}

// drainCount is drain, reporting how many pieces it committed. The
// counters that create missing target rows are drained first, then the
// others, as a flush's plan orders them: a counter that creates no rows
// (a max, a count without create_missing) then updates the row an earlier
// piece created instead of missing it, whatever the counters' names.
func (f *Flusher) drainCount(ctx context.Context) (int, error) {
	var creating []string
	for name, t := range f.targets {
		if t.Counter.CreateMissing {
			creating = append(creating, name)
		}
	}
	passes := []state.CarriedCursor{{}}
	if len(creating) > 0 {
		slices.Sort(creating)
		passes = []state.CarriedCursor{{Counters: creating}, {Counters: creating, Others: true}}
	}
	pieces := 0
	for _, cursor := range passes {
		for {
			next, more, did, err := f.drainPiece(ctx, cursor)
			if err != nil {
				return pieces, err
			}
			if did {
				pieces++
				f.opt.Metrics.FlushPieces.Inc()
			}
			if !more {
				break
			}
			cursor = next
			if err := f.opt.Failpoints.Inject(failpoint.BetweenPieces); err != nil {
				return pieces, err
			}
		}
	}
	f.drainDue = false
	f.lagApplied()
	return pieces, nil
}

// drainPiece runs one piece of drain from cursor, again with savepoints
// around the chunks that failed on a row's data (as apply does). It
// returns the cursor after it, whether keys may remain after it, and
// whether it committed anything.
func (f *Flusher) drainPiece(ctx context.Context, cursor state.CarriedCursor) (state.CarriedCursor, bool, bool, error) {
	var next state.CarriedCursor
	var more, did bool
	err := f.isolate(func(suspects map[string]bool, replay []int, sizes *[]int) error {
		var err error
		next, more, did, err = f.drainOnce(ctx, cursor, suspects, replay, sizes)
		return err
	})
	return next, more, did, err
}

// drainOnce is one try of drainPiece. It appends the size of each page it
// reads to sizes; replay are the sizes of the try before, which a retry
// uses again so that its chunks are the same.
func (f *Flusher) drainOnce(ctx context.Context, cursor state.CarriedCursor, suspects map[string]bool, replay []int, sizes *[]int) (state.CarriedCursor, bool, bool, error) {
	w := f.w
	tx, err := f.begin(ctx, f.opt.StatementTimeout)
	if err != nil {
		return cursor, false, false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	held, err := state.LockCheckpoint(ctx, tx, f.opt.Slot, w)
	if err != nil {
		return cursor, false, false, err
	}
	if !held {
		_ = tx.Rollback(ctx)
		now, err := state.ReadCheckpoint(ctx, f.opt.Pool, f.opt.Slot)
		if err != nil {
			return cursor, false, false, err
		}
		return cursor, false, false, fmt.Errorf("apply carried deltas at %s: %w: checkpoint is %s", w, ErrCheckpointMoved, now)
	}
	// Each page is one statement per counter, sized by the pace of the
	// statements before (see statements), so that the piece commits about
	// TransactionTime after it first locked a row, however slow the rows
	// are.
	st := &statements{pace: &f.pace, budget: f.opt.TransactionTime, replay: replay, sizes: sizes}
	var outs []*outcome
	var priors []map[string]state.Carried
	keys, more, attempted := 0, true, 0
	_, err = st.run(func() int {
		return min(f.opt.ChunkSize, f.opt.TransactionKeys-keys)
	}, func(limit int) (int, bool, error) {
		page, next, err := state.LoadCarriedPage(ctx, tx, f.opt.Slot, cursor, limit)
		if err != nil {
			return 0, false, err
		}
		if len(page) == 0 {
			more = false
			return 0, false, nil
		}
		out, n, err := f.drainPage(ctx, tx, st, page, next, suspects)
		if err != nil {
			return 0, false, err
		}
		outs, priors = append(outs, out), append(priors, f.prior)
		attempted += n
		keys += len(page)
		cursor = next
		more = len(page) >= limit
		return len(page), more, nil
	})
	if err != nil {
		return cursor, false, false, err
	}
	total := &outcome{applied: map[string]int64{}}
	prior := map[string]state.Carried{}
	for i, out := range outs {
		total.add(out)
		maps.Copy(prior, priors[i])
	}
	if attempted == 0 && len(total.parked) == 0 {
		// Nothing to apply (no keys, or only parked keys not due):
		// nothing was written.
		return cursor, more, false, nil
	}
	ev, err := f.commitPiece(ctx, tx, w, total)
	if err != nil {
		return cursor, false, false, err
	}
	f.prior = prior
	f.committedCarry(total)
	return cursor, more, true, f.publishEvents(ctx, ev)
}

// drainPage applies a page of carried keys in a piece's transaction, one
// statement per counter and chunk, and writes back what it could not
// apply. next is the cursor after the page. It returns what the page did
// and how many keys it tried.
func (f *Flusher) drainPage(ctx context.Context, tx pgx.Tx, st *statements, page []state.Carried, next state.CarriedCursor, suspects map[string]bool) (*outcome, int, error) {
	batches, out, err := f.plan(nil, nil, page)
	if err != nil {
		return nil, 0, err
	}
	st.locking()
	if err := f.awaitVisible(ctx, tx, batches); err != nil {
		return nil, 0, err
	}
	attempted := 0
	for _, b := range batches {
		var flushed, dropped int64
		for lo := 0; lo < len(b.keys); lo += f.opt.ChunkSize {
			hi := min(lo+f.opt.ChunkSize, len(b.keys))
			chunk := fmt.Sprintf("carried/%s/%s/%d", next.Key, b.t.Counter.Name, lo)
			if b.careful {
				chunk += "/retry"
			}
			n, d, err := f.chunk(ctx, tx, b, b.keys[lo:hi], b.deltas[lo:hi], b.careful || suspects[chunk], chunk, out)
			if err != nil {
				return nil, 0, err
			}
			flushed += n
			dropped += d
			attempted += hi - lo
		}
		out.counts = append(out.counts, counted{b.t.Counter.Name, flushed, dropped, b.t.Extremum})
	}
	if err := f.carry(ctx, tx, out, page); err != nil {
		return nil, 0, err
	}
	return out, attempted, nil
}

// commitPiece commits a piece of a drain that did what total holds, with
// its flush marker for w when it applied anything, and returns its change
// events to publish.
func (f *Flusher) commitPiece(ctx context.Context, tx pgx.Tx, w cdc.LSN, total *outcome) (events.Batch, error) {
	if len(total.applied) > 0 {
		piece := newPieceName()
		if err := cdc.PostMessage(ctx, tx, cdc.PieceMarker(f.opt.Slot, w, piece)); err != nil {
			return events.Batch{}, fmt.Errorf("flush marker: %w", err)
		}
		f.opt.FlushLog.add(w, piece, total.applied, total.missed)
	}
	// The piece's events, at W: its keys' columns plus walcount.carried
	// are the values at W, and the piece moves their deltas into the
	// columns.
	ev, err := f.eventsDue(ctx, tx, w, total, nil)
	if err != nil {
		return events.Batch{}, err
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeCommit); err != nil {
		f.opt.FlushLog.drop(w)
		return events.Batch{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		// Unlike a flush that moves W, a piece is not tried again as
		// such: forget its record, so that a later piece's marker does
		// not take it (a piece that did commit then costs dirty marks,
		// never a wrong compensation).
		f.opt.FlushLog.drop(w)
		return events.Batch{}, fmt.Errorf("commit flush: %w", err)
	}
	return ev, nil
}

// newPieceName returns a name for a piece's marker that no other process
// draws.
func newPieceName() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
