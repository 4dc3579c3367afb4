package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// dataError is a chunk's statement failing on a row's data.
type dataError struct {
	counter, chunk string
	err            error
}

func (e *dataError) Error() string {
	return fmt.Sprintf("update counter %s (chunk %s): %v", e.counter, e.chunk, e.err)
}
func (e *dataError) Unwrap() error { return e.err }

// isolate runs try, one try of a flush transaction, until it ends
// without a data error in a chunk it has not isolated yet: each chunk that
// failed on a row's data becomes a suspect, which the next try runs in a
// savepoint, split in halves until the keys that fail are alone (see
// chunk). Each try gets the statement sizes of the try before (replay, see
// statements) and records its own in sizes.
func (f *Flusher) isolate(try func(suspects map[string]bool, replay []int, sizes *[]int) error) error {
	suspects := map[string]bool{}
	var replay []int
	for {
		var sizes []int
		err := try(suspects, replay, &sizes)
		replay = sizes
		var de *dataError
		if errors.As(err, &de) && !suspects[de.chunk] {
			f.log.Warn("a flush chunk failed on a row's data; applying it again key by key to isolate the row",
				zap.String("counter", de.counter), zap.String("chunk", de.chunk), zap.Error(de.err))
			suspects[de.chunk] = true
			continue
		}
		return err
	}
}

// isDataError reports whether err is an error of one row's data or
// privileges, which parks the row's key instead of failing the flush:
// SQLSTATE classes 22 (data exception), 23 (integrity constraint
// violation: a CHECK), P0 (PL/pgSQL: a trigger that raises) and 42501
// (insufficient privilege: a row-level security policy's WITH CHECK).
func isDataError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "P0") || pe.Code == "42501"
}

// hiddenByPolicy reports whether err is PostgreSQL refusing a statement
// under row_security = off (Options.RowSecurityOff) because a row-level
// security policy applies to it.
func hiddenByPolicy(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42501" && strings.Contains(pe.Message, "query would be affected by row-level security policy")
}

// partialView is the error of a flush statement that a policy enabled
// since the session started refused (hiddenByPolicy): ErrPartialView,
// with the fix when the target (or an extremum's source) is the table
// hidden.
func (f *Flusher) partialView(ctx context.Context, b *attemptBatch, refused error) error {
	check := counter.CheckTargetView
	if b.t.Extremum {
		// Its flush reads the source rows too.
		check = counter.CheckRowViews
	}
	if err := check(ctx, f.opt.Pool, b.t.Counter); errors.Is(err, counter.ErrPartialView) {
		return fmt.Errorf("flush: %w", err)
	}
	return fmt.Errorf("flush: counter %s: %w: %v", b.t.Counter.Name, counter.ErrPartialView, refused)
}

// isLockTimeout reports whether err is lock_timeout's.
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// IsTransient reports whether a flush failed on a wait walcount bounds
// itself (lock_timeout on a table lock, statement_timeout): nothing was
// applied, and the next flush tries again.
func IsTransient(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "57014")
}

// chunk runs the flush statement on one chunk of keys and sorts its keys
// into out: applied, without a row (missed), deferred (their row is
// locked by another transaction) or parked. In careful mode the chunk runs
// in a savepoint, and a data error splits it in halves until the failing
// keys are alone; outside it, a data error fails the transaction with a
// *dataError naming the chunk. It returns the keys applied and dropped.
func (f *Flusher) chunk(ctx context.Context, tx pgx.Tx, b *attemptBatch, keys []string, deltas []int64, careful bool, id string, out *outcome) (flushed, dropped int64, err error) {
	name := b.t.Counter.Name
	creates := b.t.Counter.CreateMissing
	// A create_missing chunk runs in a savepoint too: its INSERT waits
	// for an app transaction inserting the same key (no SKIP LOCKED for a
	// unique index), up to lock_timeout; the chunk is then split until
	// that key is alone, and the key is carried like a locked row.
	guarded := careful || creates
	if guarded {
		if _, err := tx.Exec(ctx, "SAVEPOINT walcount_chunk"); err != nil {
			return 0, 0, fmt.Errorf("update counter %s: %w", name, err)
		}
	}
	rows, err := tx.Query(ctx, b.t.Flush, append([]any{keys, deltas}, b.t.FlushArgs...)...)
	var res []notHit
	if err == nil {
		res, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (notHit, error) {
			var n notHit
			if creates {
				return n, row.Scan(&n.key, &n.present, &n.locked, &n.created)
			}
			err := row.Scan(&n.key, &n.present, &n.locked)
			return n, err
		})
	}
	if err != nil && creates && isLockTimeout(err) {
		return f.split(ctx, tx, b, keys, deltas, careful, id, out, err, func(key string, delta int64) {
			f.hold(name, key, delta, out)
		})
	}
	if err != nil && hiddenByPolicy(err) {
		return 0, 0, f.partialView(ctx, b, err)
	}
	if err != nil {
		if !isDataError(err) {
			return 0, 0, fmt.Errorf("update counter %s: %w", name, err)
		}
		if !careful {
			return 0, 0, &dataError{counter: name, chunk: id, err: err}
		}
		msg := errorText(err)
		return f.split(ctx, tx, b, keys, deltas, true, id, out, err, func(key string, delta int64) {
			f.park(b, key, delta, msg, out)
		})
	}
	if guarded {
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT walcount_chunk"); err != nil {
			return 0, 0, fmt.Errorf("update counter %s: %w", name, err)
		}
	}
	flushed, dropped = f.sortKeys(b, keys, deltas, res, out)
	return flushed, dropped, nil
}

// notHit is a key of a chunk that its statement did not update.
type notHit struct {
	key             string
	present, locked bool
	// created: a create_missing counter's statement created the key's
	// row (counter.createFlush).
	created bool
}

// split undoes a guarded chunk whose statement failed with failed, and
// runs its halves as chunks of their own; a chunk of one key goes to
// alone instead.
func (f *Flusher) split(ctx context.Context, tx pgx.Tx, b *attemptBatch, keys []string, deltas []int64, careful bool, id string, out *outcome,
	failed error, alone func(key string, delta int64)) (flushed, dropped int64, err error) {
	for _, q := range []string{"ROLLBACK TO SAVEPOINT walcount_chunk", "RELEASE SAVEPOINT walcount_chunk"} {
		if _, rerr := tx.Exec(ctx, q); rerr != nil {
			return 0, 0, fmt.Errorf("update counter %s: %w (after %v)", b.t.Counter.Name, rerr, failed)
		}
	}
	if len(keys) == 1 {
		alone(keys[0], deltas[0])
		return 0, 0, nil
	}
	mid := len(keys) / 2
	n1, d1, err := f.chunk(ctx, tx, b, keys[:mid], deltas[:mid], careful, id, out)
	if err != nil {
		return 0, 0, err
	}
	n2, d2, err := f.chunk(ctx, tx, b, keys[mid:], deltas[mid:], careful, id, out)
	return n1 + n2, d1 + d2, err
}

// sortKeys sorts the keys of a chunk whose statement succeeded into out,
// by what the statement returned of the keys it did not update (res), and
// returns the keys applied and dropped.
func (f *Flusher) sortKeys(b *attemptBatch, keys []string, deltas []int64, res []notHit, out *outcome) (flushed, dropped int64) {
	name := b.t.Counter.Name
	skipped := make(map[string]notHit, len(res))
	for _, n := range res {
		skipped[n.key] = n
	}
	for i, k := range keys {
		field := counter.Field(name, k)
		n, ok := skipped[k]
		switch {
		case !ok:
			out.applied[field] = deltas[i]
			flushed++
		case n.created:
			out.applied[field] = deltas[i]
			flushed++
			out.created = append(out.created, createdKey{counter: name, key: k, delta: deltas[i]})
		case n.locked:
			// Locked by this statement and not updated: a BEFORE UPDATE
			// trigger returned NULL for the row.
			f.park(b, k, deltas[i], "the row's UPDATE was skipped (a BEFORE UPDATE trigger returned NULL)", out)
		case n.present:
			// Another transaction holds the row: carried to the next
			// flush.
			f.hold(name, k, deltas[i], out)
		default:
			if out.missed == nil {
				out.missed = map[string]bool{}
			}
			out.missed[field] = true
			out.applied[field] = deltas[i]
			dropped++
		}
	}
	return flushed, dropped
}

// hold carries the delta of a key whose row another transaction holds to
// the next flush.
func (f *Flusher) hold(name, key string, delta int64, out *outcome) {
	c := state.Carried{Counter: name, Key: key, Delta: delta}
	if p, ok := f.prior[counter.Field(name, key)]; ok {
		c.Since = p.Since
	}
	out.carry = append(out.carry, c)
}

// errorText is a data error as a parked key records it.
func errorText(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	return err.Error()
}

// park keeps a key whose UPDATE failed on its row's data in
// walcount.carried, to be tried again after ParkRetry.
func (f *Flusher) park(b *attemptBatch, key string, delta int64, msg string, out *outcome) {
	name := b.t.Counter.Name
	field := counter.Field(name, key)
	c := state.Carried{Counter: name, Key: key, Delta: delta, Parked: msg}
	p, was := f.prior[field]
	if was {
		c.Since = p.Since
	}
	out.carry = append(out.carry, c)
	out.parked = append(out.parked, parkedKey{counter: name, key: key, delta: delta, err: msg, newly: !was || p.Parked == ""})
}
