package cdc

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// MessagePrefix is the prefix of walcount's logical decoding messages:
// heartbeats and reconciliation markers.
const MessagePrefix = "walcount"

// RowQuerier reads one row; *pgx.Conn, *pgxpool.Pool and pgx.Tx fit.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// EmitMessage writes a transactional logical decoding message with
// walcount's prefix. It reaches the stream as a transaction of its own
// (unless q is inside a larger transaction) and returns the message's LSN.
// See https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-REPLICATION.
func EmitMessage(ctx context.Context, q RowQuerier, content string) (LSN, error) {
	var lsn LSN
	if err := q.QueryRow(ctx, "SELECT pg_logical_emit_message(true, $1, $2)::text", MessagePrefix, content).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("emit logical message: %w", err)
	}
	return lsn, nil
}
