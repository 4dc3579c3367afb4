package cdc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pglogrepl"
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

// flushMarker is the content of the message each flush transaction emits:
// it places the flush of (…, upto] in the stream (design rule 17).
type flushMarker struct {
	Flush string `json:"flush"`
	Slot  string `json:"slot"`
}

var flushTag = []byte(`"flush"`)

// FlushMarker returns the message content the flush of (…, upto] of slot
// emits in its own transaction.
func FlushMarker(slot string, upto LSN) string {
	b, _ := json.Marshal(flushMarker{Flush: upto.String(), Slot: slot})
	return string(b)
}

// ParseFlushMarker parses FlushMarker's content; ok is false for any other
// message.
func ParseFlushMarker(content []byte) (slot string, upto LSN, ok bool) {
	if !bytes.Contains(content, flushTag) {
		return "", 0, false
	}
	var m flushMarker
	if err := json.Unmarshal(content, &m); err != nil || m.Flush == "" {
		return "", 0, false
	}
	upto, err := pglogrepl.ParseLSN(m.Flush)
	if err != nil {
		return "", 0, false
	}
	return m.Slot, upto, true
}
