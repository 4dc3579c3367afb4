package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
)

// maxCorrectionsPerMessage bounds the corrections one message carries, so
// that a backfill's many corrections travel in messages of a few hundred
// kilobytes each.
const maxCorrectionsPerMessage = 10_000

// emitCorrections carries corrections through the WAL: a transactional
// message holds them, the stream turns it into deltas of its transaction,
// and they are flushed exactly once with everything else, even when
// walcount crashes before that flush and the stream is replayed. It
// returns a position past the messages: the corrections count as applied
// only once W has passed it, so a run's figures never claim a correction
// that is not in the counter columns.
func (r *Reconciler) emitCorrections(ctx context.Context, drift []KeyDrift) (cdc.LSN, error) {
	for chunk := range slices.Chunk(drift, maxCorrectionsPerMessage) {
		content, err := r.correctionContent(chunk)
		if err != nil {
			return 0, err
		}
		if err := cdc.PostMessage(ctx, r.opt.Pool, content); err != nil {
			return 0, fmt.Errorf("emit corrections: %w", err)
		}
		if err := r.opt.Failpoints.Inject(failpoint.AfterCorrection); err != nil {
			return 0, err
		}
	}
	// The messages' transactions end before the server's insert position
	// read after they committed.
	return r.correctionsEnd(ctx)
}

// correctVia writes a backfill's corrections of a via counter straight
// into its via table, in transactions that each open with a trusted quiet
// message naming top, the level above (cdc.QuietMessage): the aggregator
// counts nothing of their changes for top. top was counted before
// walcount (an app's triggers kept it exact, which its via table was not
// yet), so carrying these corrections up as deltas would count them twice,
// and measuring top before them would "correct" it against a via table
// not filled yet; its own backfill comes after and measures it against
// the via rows as they are then (docs/design.md §5, "Backfill order").
// The corrections are in the via table once their transaction commits;
// a key whose via row is gone (collected meanwhile) is corrected through
// the WAL instead, as emitCorrections does. It returns a position past
// the transactions, as emitCorrections does.
func (r *Reconciler) correctVia(ctx context.Context, sql *counter.Resolved, top string, drift []KeyDrift) (cdc.LSN, error) {
	quiet := cdc.QuietMessage(r.opt.Slot, []string{top})
	for chunk := range slices.Chunk(drift, maxCorrectionsPerMessage) {
		keys := make([]string, len(chunk))
		deltas := make([]int64, len(chunk))
		for i, d := range chunk {
			keys[i], deltas[i] = d.Key, d.Correction
		}
		err := pgx.BeginFunc(ctx, r.opt.Pool, func(tx pgx.Tx) error {
			// The message first: the aggregator reads it before the
			// changes it covers.
			if err := cdc.PostMessage(ctx, tx, quiet); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, sql.Correct, append([]any{keys, deltas}, sql.FlushArgs...)...)
			if err != nil {
				return err
			}
			missed, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(missed) == 0 {
				return err
			}
			var carried []KeyDrift
			for _, d := range chunk {
				if slices.Contains(missed, d.Key) {
					carried = append(carried, d)
				}
			}
			content, err := r.correctionContent(carried)
			if err != nil {
				return err
			}
			return cdc.PostMessage(ctx, tx, content)
		})
		if err != nil {
			return 0, fmt.Errorf("correct via table of %s: %w", top, err)
		}
		if err := r.opt.Failpoints.Inject(failpoint.AfterCorrection); err != nil {
			return 0, err
		}
	}
	return r.correctionsEnd(ctx)
}

// correctionContent is the content of the message that carries the
// corrections of drift (correction).
func (r *Reconciler) correctionContent(drift []KeyDrift) (string, error) {
	c := correction{Correct: make(map[string]int64, len(drift)), Slot: r.opt.Slot}
	for _, d := range drift {
		c.Correct[counter.Field(d.Counter, d.Key)] = d.Correction
	}
	content, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	return string(content), nil
}

// correctionsEnd returns the server's insert position, read once the
// corrections' transactions committed: a position past them.
func (r *Reconciler) correctionsEnd(ctx context.Context) (cdc.LSN, error) {
	var end cdc.LSN
	if err := r.opt.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
		return 0, fmt.Errorf("read the position of the corrections: %w", err)
	}
	return end, nil
}
