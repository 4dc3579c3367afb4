package sink

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/state"
)

// apply runs one PostgreSQL transaction that moves the checkpoint from
// W=from to upto and applies the batch (design rule 2): checkpoint
// compare-and-set first, then optional resets (a TRUNCATE barrier), then
// the deltas carried from earlier flushes, with the batch's lifecycle
// moves run on them, merged with the batch's, then the counter updates,
// chunk by chunk, each locking only the rows it can lock at once; what it
// could not lock, or not write, is carried in walcount.carried, written
// in the same transaction. It reports false, without error, when the
// batch had already been committed.
//
// A data error on a row (SQLSTATE classes 22, 23, P0, or 42501) aborts
// the transaction; apply then runs it again with that chunk in a
// savepoint, split in halves until the keys that fail are alone, and
// parks those. Only the chunks that failed get savepoints: every
// subtransaction that writes takes an XID, and more than 64 of them in
// one transaction would slow every snapshot of the database.
func (f *Flusher) apply(ctx context.Context, from, upto cdc.LSN, fields map[string]int64, moves []counter.Move, resets []*counter.Resolved, bail bool) (bool, error) {
	var applied bool
	err := f.isolate(func(suspects map[string]bool, replay []int, sizes *[]int) error {
		var err error
		applied, err = f.applyOnce(ctx, from, upto, fields, moves, resets, suspects, bail, replay, sizes)
		return err
	})
	return applied, err
}

// outcome is what one flush transaction did with its keys.
type outcome struct {
	// applied holds the deltas the flush applied, and those it dropped
	// for want of a row (missed): the flush log needs both (package
	// aggregator follows them when the flush crossed a lifecycle event).
	applied map[string]int64
	missed  map[string]bool
	carry   []state.Carried // deferred and parked keys, after the flush
	// parked are the keys parked by this flush, newly is true for those
	// not parked before (they get a dirty mark and a loud log).
	parked []parkedKey
	// counts are the keys applied and dropped per counter, for the
	// metrics once the flush committed.
	counts []counted
	// created are the keys whose target row the flush created
	// (create_missing).
	created []createdKey
}

// add takes in what another page of the same piece did with its keys
// (what it carried, the page wrote itself).
func (o *outcome) add(p *outcome) {
	maps.Copy(o.applied, p.applied)
	for k := range p.missed {
		if o.missed == nil {
			o.missed = map[string]bool{}
		}
		o.missed[k] = true
	}
	o.parked = append(o.parked, p.parked...)
	o.created = append(o.created, p.created...)
	o.counts = append(o.counts, p.counts...)
}

type createdKey struct {
	counter, key string
	delta        int64
}

type counted struct {
	counter          string
	flushed, dropped int64
	// extremum: the keys flushed were recomputes of a max or min.
	extremum bool
}

type parkedKey struct {
	counter, key string
	delta        int64
	err          string
	newly        bool
}

// applyOnce is one try of apply.
func (f *Flusher) applyOnce(ctx context.Context, from, upto cdc.LSN, fields map[string]int64, moves []counter.Move,
	resets []*counter.Resolved, suspects map[string]bool, bail bool, replay []int, sizes *[]int) (bool, error) {
	tx, err := f.begin(ctx, f.opt.StatementTimeout)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	moved, err := state.CompareAndSet(ctx, tx, f.opt.Slot, from, upto)
	if err != nil {
		return false, err
	}
	if !moved {
		// Someone committed this batch already (a retried flush or a
		// takeover). Nothing is applied; learn where W is now.
		_ = tx.Rollback(ctx)
		return false, f.alreadyApplied(ctx, from, upto)
	}
	held, err := f.reset(ctx, tx, resets)
	if err != nil {
		return false, err
	}
	prior, err := state.LoadCarried(ctx, tx, f.opt.Slot)
	if err != nil {
		return false, err
	}
	loaded := slices.Clone(prior) // plan changes prior's entries
	prior = append(prior, held...)
	batches, out, err := f.plan(fields, moves, prior)
	if err != nil {
		return false, err
	}
	if err := f.awaitVisible(ctx, tx, batches); err != nil {
		return false, err
	}
	// Statements sized by their pace (see statements); once the
	// transaction has updated rows for TransactionTime with keys still to
	// go, a flush that may (bail) gives up, which frees its row locks at
	// once, and the batch is applied in pieces instead (errSlowFlush).
	st := &statements{pace: &f.pace, budget: f.opt.TransactionTime, overrun: !bail, replay: replay, sizes: sizes}
	spent, err := f.applyChunks(ctx, tx, batches, suspects, st, out)
	if err != nil {
		return false, err
	}
	if spent {
		return false, errSlowFlush
	}
	if err := f.carry(ctx, tx, out, loaded); err != nil {
		return false, err
	}
	if from < f.inherited {
		if err := f.markInheritedMoves(ctx, tx, moves); err != nil {
			return false, err
		}
	}
	// The marker places this transaction in the stream, among the target
	// rows' lifecycle events (see package aggregator); the log holds what
	// it applied until the stream has met it. A flush without deltas has
	// nothing to follow, and emits nothing: a marker is a transaction the
	// next flush carries, and an idle walcount must stay idle.
	if len(batches) > 0 {
		if err := cdc.PostMessage(ctx, tx, cdc.FlushMarker(f.opt.Slot, upto)); err != nil {
			return false, fmt.Errorf("flush marker: %w", err)
		}
		f.opt.FlushLog.replace(upto, out.applied, out.missed)
	}
	ev, err := f.eventsDue(ctx, tx, upto, out, resets)
	if err != nil {
		return false, err
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeCommit); err != nil {
		f.opt.FlushLog.drop(upto)
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit's outcome is unknown when the connection broke: keep
		// the record, which costs nothing if the flush did not commit.
		return false, fmt.Errorf("commit flush: %w", err)
	}
	f.committedCarry(out)
	// A failure here ends the session with the flush committed: the next
	// one publishes its events from the outbox, and the checkpoint says
	// the batch was applied.
	return true, f.publishEvents(ctx, ev)
}

// reset runs the resets of a TRUNCATE barrier and returns, as carried
// deltas, those of the rows another transaction holds.
func (f *Flusher) reset(ctx context.Context, tx pgx.Tx, resets []*counter.Resolved) ([]state.Carried, error) {
	if len(resets) > 0 {
		names := make([]string, len(resets))
		for i, t := range resets {
			names[i] = t.Counter.Name
		}
		// The carried deltas of a truncated counter are of rows counted
		// before the TRUNCATE.
		if err := state.DropCarried(ctx, tx, f.opt.Slot, names); err != nil {
			return nil, err
		}
	}
	var held []state.Carried
	for _, t := range resets {
		rows, err := tx.Query(ctx, t.Reset)
		if err != nil {
			return nil, fmt.Errorf("reset counter %s: %w", t.Counter.Name, err)
		}
		// A row another transaction holds keeps its column: its reset is
		// carried, as the delta that takes the column to 0.
		err = func() error {
			defer rows.Close()
			for rows.Next() {
				c := state.Carried{Counter: t.Counter.Name, Due: true}
				if err := rows.Scan(&c.Key, &c.Delta); err != nil {
					return err
				}
				c.Delta = -c.Delta
				held = append(held, c)
			}
			return rows.Err()
		}()
		if err != nil {
			return nil, fmt.Errorf("reset counter %s: %w", t.Counter.Name, err)
		}
	}
	return held, nil
}

// applyChunks runs the batches' statements chunk by chunk, each chunk
// sized by st, and counts into out what each counter's chunks applied
// and dropped. It reports whether st's budget ran out with keys to go.
func (f *Flusher) applyChunks(ctx context.Context, tx pgx.Tx, batches []*attemptBatch, suspects map[string]bool, st *statements, out *outcome) (bool, error) {
	i, lo := 0, 0 // the next chunk starts at batches[i].keys[lo]
	var flushed, dropped int64
	// ended counts the batches whose keys have all run.
	ended := func() {
		for i < len(batches) && lo >= len(batches[i].keys) {
			b := batches[i]
			out.counts = append(out.counts, counted{b.t.Counter.Name, flushed, dropped, b.t.Extremum})
			i, lo, flushed, dropped = i+1, 0, 0, 0
		}
	}
	ended()
	return st.run(func() int {
		if i == len(batches) {
			return 0
		}
		return f.opt.ChunkSize
	}, func(n int) (int, bool, error) {
		b := batches[i]
		hi := min(lo+n, len(b.keys))
		chunk := fmt.Sprintf("%s/%d", b.t.Counter.Name, lo)
		if b.careful {
			chunk += "/retry"
		}
		st.locking()
		nf, nd, err := f.chunk(ctx, tx, b, b.keys[lo:hi], b.deltas[lo:hi], b.careful || suspects[chunk], chunk, out)
		if err != nil {
			return 0, false, err
		}
		flushed += nf
		dropped += nd
		took := hi - lo
		lo = hi
		ended()
		return took, i < len(batches), nil
	})
}

// Bounds of awaitVisible.
const (
	visibleWait = 5 * time.Second
	visiblePoll = 2 * time.Millisecond
)

// awaitVisible makes the extremum batches' recomputes see every
// transaction they were handed: a transaction's commit is in the WAL, and
// so in the stream, before other sessions see it, and with synchronous
// replication it stays invisible until a synchronous standby confirms it
// (the backend waits with wait_event SyncRep, its transaction committed in
// the WAL and the commit log, its xid still running). A recompute then
// would miss a delete and keep the deleted maximum for good. So the flush
// waits until the transactions waiting for a standby when it starts have
// ended (visible to the next statement's snapshot, READ COMMITTED), at
// most visibleWait. A transaction that starts waiting later committed
// after the batch's transactions were all in the WAL, so it is in a later
// batch, which recomputes its keys. After visibleWait the extremum keys
// are recomputed anyway and marked dirty, for reconciliation to measure.
// pg_stat_activity shows other roles' transactions only to a role with
// pg_read_all_stats (or a superuser). Batches of counts and sums do not
// wait: their deltas come from the stream.
func (f *Flusher) awaitVisible(ctx context.Context, tx pgx.Tx, batches []*attemptBatch) error {
	var ext []*attemptBatch
	for _, b := range batches {
		if b.t.Extremum && len(b.keys) > 0 {
			ext = append(ext, b)
		}
	}
	if len(ext) == 0 {
		return nil
	}
	var late []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(a.backend_xid::text), '{}') FROM pg_stat_activity a
WHERE a.wait_event = 'SyncRep' AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()`).Scan(&late); err != nil {
		return fmt.Errorf("read the transactions waiting for a synchronous standby: %w", err)
	}
	deadline := time.Now().Add(visibleWait)
	for len(late) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(visiblePoll):
		}
		// pg_stat_activity is read once per transaction unless cleared.
		if _, err := tx.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			return fmt.Errorf("wait for the transactions waiting for a synchronous standby: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT /* walcount: wait for synchronous standbys */ coalesce(array_agg(x), '{}') FROM unnest($1::text[]) AS x
WHERE EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid = x::xid)`, late).Scan(&late); err != nil {
			return fmt.Errorf("wait for the transactions waiting for a synchronous standby: %w", err)
		}
		if len(late) > 0 && time.Now().After(deadline) {
			f.log.Warn("transactions committed in the WAL still wait for a synchronous standby: max and min counters are recomputed without them and marked dirty for reconciliation",
				zap.Strings("xids", late), zap.Duration("waited", visibleWait))
			for _, b := range ext {
				if err := state.MarkDirty(ctx, tx, f.opt.Slot, b.t.Counter.Name, slices.Clone(b.keys), "a max or min was recomputed while a transaction committed in the WAL waited for a synchronous standby"); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return nil
}
