package state

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Dirty is a counter, or one key of it, that walcount cannot vouch for:
// part of its history was not seen (design rule 14). Reconciliation
// measures it exactly and clears the mark.
type Dirty struct {
	ID      int64  `json:"id"`
	Counter string `json:"counter"`
	// Key is the key; nil marks the whole counter.
	Key   *string   `json:"key,omitempty"`
	Cause string    `json:"cause"`
	Since time.Time `json:"since"`
}

// MarkDirty records keys of counter as dirty (nil keys: the whole counter)
// with the cause.
func MarkDirty(ctx context.Context, q Querier, slot, counter string, keys []string, cause string) error {
	if keys == nil {
		_, err := q.Exec(ctx, `INSERT INTO walcount.dirty (slot_name, counter, key, cause) VALUES ($1, $2, NULL, $3)`, slot, counter, cause)
		if err != nil {
			return fmt.Errorf("mark counter %s dirty: %w", counter, err)
		}
		return nil
	}
	_, err := q.Exec(ctx, `INSERT INTO walcount.dirty (slot_name, counter, key, cause) SELECT $1, $2, k, $4 FROM unnest($3::text[]) AS k`,
		slot, counter, keys, cause)
	if err != nil {
		return fmt.Errorf("mark %d keys of counter %s dirty: %w", len(keys), counter, err)
	}
	return nil
}

// ListDirty returns the slot's dirty marks, oldest first.
func ListDirty(ctx context.Context, q Querier, slot string) ([]Dirty, error) {
	rows, err := q.Query(ctx, `SELECT id, counter, key, cause, since FROM walcount.dirty WHERE slot_name = $1 ORDER BY id`, slot)
	if err != nil {
		return nil, fmt.Errorf("read dirty counters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Dirty, error) {
		var d Dirty
		err := row.Scan(&d.ID, &d.Counter, &d.Key, &d.Cause, &d.Since)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read dirty counters: %w", err)
	}
	return out, nil
}

// ClearDirty removes the marks with the given ids, once what they marked
// was reconciled.
func ClearDirty(ctx context.Context, q Querier, ids []int64) error {
	if _, err := q.Exec(ctx, `DELETE FROM walcount.dirty WHERE id = ANY ($1)`, ids); err != nil {
		return fmt.Errorf("clear dirty marks: %w", err)
	}
	return nil
}
