package state

import (
	"context"
	"fmt"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/operator"
)

// ErrOwned is wrapped by *OwnedError.
var ErrOwned = operator.NewError("counter column is kept by another slot")

// OwnedError says that a target column belongs to another slot: two slots
// keeping one column would count every change twice (design rule 15).
type OwnedError struct {
	Table, Column string
	// Owner is the slot that keeps the column.
	Owner string
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("%s.%s is kept by slot %s: two slots keeping one column count every change twice; "+
		"to move it, stop the walcount of slot %s and run walcount teardown --slot %s (which releases its columns), then walcount setup",
		e.Table, e.Column, e.Owner, e.Owner, e.Owner)
}

// Unwrap makes errors.Is(err, ErrOwned) true.
func (e *OwnedError) Unwrap() error { return ErrOwned }

// Owner returns the slot that keeps c's target column, "" when none does.
func Owner(ctx context.Context, q Querier, c counter.Counter) (string, error) {
	var owner string
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT slot_name FROM walcount.owners WHERE target_table = $1 AND target_column = $2), '')`,
		c.Target, c.Column).Scan(&owner)
	if err != nil {
		return "", fmt.Errorf("read the owner of %s.%s: %w", c.Target, c.Column, err)
	}
	return owner, nil
}

// CheckOwnership returns an *OwnedError when another slot keeps one of
// the counters' columns, and ErrNotClaimed when slot has not claimed one
// yet (walcount setup claims them).
func CheckOwnership(ctx context.Context, q Querier, slot string, counters []counter.Counter) error {
	for _, c := range counters {
		owner, err := Owner(ctx, q, c)
		if err != nil {
			return err
		}
		switch owner {
		case slot:
		case "":
			return fmt.Errorf("%w: %s.%s (counter %s)", ErrNotClaimed, c.Target, c.Column, c.Name)
		default:
			return &OwnedError{Table: c.Target, Column: c.Column, Owner: owner}
		}
	}
	return nil
}

// ErrNotClaimed means a counter column has no owner yet.
var ErrNotClaimed = operator.NewError("counter column not claimed by the slot yet (run walcount setup)")

// Claim makes slot the owner of the counters' columns, and releases the
// columns slot owned for counters it no longer has. It fails with an
// *OwnedError when another slot keeps one of them. Run it in the
// transaction that sets up the slot.
func Claim(ctx context.Context, q Querier, slot string, counters []counter.Counter) error {
	tables, columns, names := make([]string, len(counters)), make([]string, len(counters)), make([]string, len(counters))
	for i, c := range counters {
		tables[i], columns[i], names[i] = c.Target, c.Column, c.Name
	}
	if _, err := q.Exec(ctx, `DELETE FROM walcount.owners o WHERE slot_name = $1
AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) AS c(t, col) WHERE c.t = o.target_table AND c.col = o.target_column)`,
		slot, tables, columns); err != nil {
		return fmt.Errorf("release columns of slot %s: %w", slot, err)
	}
	if _, err := q.Exec(ctx, `INSERT INTO walcount.owners (target_table, target_column, slot_name, counter)
SELECT t, col, $1, n FROM unnest($2::text[], $3::text[], $4::text[]) AS c(t, col, n)
ON CONFLICT (target_table, target_column) DO UPDATE SET counter = excluded.counter
WHERE walcount.owners.slot_name = excluded.slot_name`, slot, tables, columns, names); err != nil {
		return fmt.Errorf("claim columns for slot %s: %w", slot, err)
	}
	for _, c := range counters {
		owner, err := Owner(ctx, q, c)
		if err != nil {
			return err
		}
		if owner != slot {
			return &OwnedError{Table: c.Target, Column: c.Column, Owner: owner}
		}
	}
	return nil
}

// Release forgets everything walcount keeps for slot: its checkpoint, runs,
// backfills, dirty marks, carried deltas and column ownership. It returns how many slots
// still have a checkpoint, and whether one of them reads publication.
func Release(ctx context.Context, q Querier, slot, publication string) (others int, pubShared bool, err error) {
	for _, stmt := range []string{
		`DELETE FROM walcount.owners WHERE slot_name = $1`,
		`DELETE FROM walcount.dirty WHERE slot_name = $1`,
		`DELETE FROM walcount.carried WHERE slot_name = $1`,
		`DELETE FROM walcount.partitions WHERE slot_name = $1`,
		`DELETE FROM walcount.counters WHERE slot_name = $1`,
		`DELETE FROM walcount.reconcile_runs WHERE slot_name = $1`,
		`DELETE FROM walcount.checkpoint WHERE slot_name = $1`,
	} {
		if _, err := q.Exec(ctx, stmt, slot); err != nil {
			return 0, false, fmt.Errorf("release slot %s: %w", slot, err)
		}
	}
	// A checkpoint of an older walcount does not say which publication it
	// reads: count it as sharing this one, to be safe.
	err = q.QueryRow(ctx, `SELECT count(*), coalesce(bool_or(publication IS NULL OR publication = $1), false) FROM walcount.checkpoint`,
		publication).Scan(&others, &pubShared)
	if err != nil {
		return 0, false, fmt.Errorf("release slot %s: %w", slot, err)
	}
	return others, pubShared, nil
}

// SetPublication records the publication slot reads.
func SetPublication(ctx context.Context, q Querier, slot, publication string) error {
	if _, err := q.Exec(ctx, `UPDATE walcount.checkpoint SET publication = $2 WHERE slot_name = $1`, slot, publication); err != nil {
		return fmt.Errorf("record the publication of slot %s: %w", slot, err)
	}
	return nil
}
