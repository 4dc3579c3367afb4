package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
)

// Schema is walcount's state schema.
const Schema = "walcount"

// CheckpointDDL creates the checkpoint table (DESIGN §2 rule 1).
const CheckpointDDL = `CREATE TABLE IF NOT EXISTS walcount.checkpoint (
    slot_name  text PRIMARY KEY,
    lsn        pg_lsn NOT NULL,
    updated_at timestamptz NOT NULL
)`

// ErrNoCheckpoint means walcount setup has not run for the slot.
var ErrNoCheckpoint = errors.New("no checkpoint for the slot (run walcount setup)")

// Querier is the part of pgx that reads one row; *pgx.Conn, *pgxpool.Pool
// and pgx.Tx fit.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadCheckpoint returns W for slot.
func ReadCheckpoint(ctx context.Context, q Querier, slot string) (cdc.LSN, error) {
	var lsn cdc.LSN
	err := q.QueryRow(ctx, `SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1`, slot).Scan(&lsn)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read checkpoint of slot %q: %w", slot, ErrNoCheckpoint)
	}
	if err != nil {
		return 0, fmt.Errorf("read checkpoint of slot %q: %w", slot, err)
	}
	return lsn, nil
}
