package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/state"
)

// settle waits until walcount's checkpoint passes a marker emitted now:
// every transaction committed before the marker is then in the counter
// columns (design rule 1).
func settle(ctx context.Context, db *pgxpool.Pool, daemonDone <-chan error) error {
	marker, err := cdc.EmitMessage(ctx, db, `{"demo":"settle"}`)
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var w cdc.LSN
	for {
		w, err = state.ReadCheckpoint(ctx, db, Slot)
		if err == nil && w > marker {
			return nil
		}
		select {
		case derr := <-daemonDone:
			return fmt.Errorf("settle: walcount daemon stopped: %w", errOrStopped(derr))
		case <-ctx.Done():
			return fmt.Errorf("settle: checkpoint %s did not pass the marker %s: %w", w, marker, ctx.Err())
		case <-t.C:
		}
	}
}

// verifyQuery lists every post whose likes_count differs from COUNT(*).
var verifyQuery = `SELECT p.id, p.likes_count, count(l.id)
FROM ` + posts + ` p LEFT JOIN ` + likes + ` l ON l.post_id = p.id
GROUP BY p.id, p.likes_count
HAVING p.likes_count <> count(l.id)
ORDER BY p.id`

// verify compares every post with COUNT(*), in one snapshot.
func verify(ctx context.Context, db *pgxpool.Pool, res *Result) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read-only
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+posts+`), (SELECT count(*) FROM `+likes+`)`).
		Scan(&res.Posts, &res.Rows); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	rows, err := tx.Query(ctx, verifyQuery)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p PostCount
		if err := rows.Scan(&p.ID, &p.LikesCount, &p.Count); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		res.MismatchCount++
		if len(res.Mismatches) < maxReported {
			res.Mismatches = append(res.Mismatches, p)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

func printVerdict(out io.Writer, r Result) {
	fmt.Fprintf(out, "settled in %s; the app made %s likes and %s unlikes in %s transactions; apply lag p50 %s, p99 %s\n",
		r.Settle.Round(time.Millisecond), num(float64(r.Likes)), num(float64(r.Unlikes)), num(float64(r.Transactions)),
		lag(r.LagP50), lag(r.LagP99))
	if r.Exact() {
		fmt.Fprintf(out, "verdict: EXACT: all %s posts have likes_count = COUNT(*) (%s likes rows)\n",
			num(float64(r.Posts)), num(float64(r.Rows)))
		return
	}
	fmt.Fprintf(out, "verdict: MISMATCH: %d of %d posts have likes_count <> COUNT(*):\n", r.MismatchCount, r.Posts)
	for _, p := range r.Mismatches {
		fmt.Fprintf(out, "  post %d: likes_count %d, COUNT(*) %d\n", p.ID, p.LikesCount, p.Count)
	}
	if r.MismatchCount > len(r.Mismatches) {
		fmt.Fprintf(out, "  … and %d more\n", r.MismatchCount-len(r.Mismatches))
	}
}
