package cdc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// MessagePrefix is the prefix of walcount's logical decoding messages,
// and the Prefix of the events its message rows become.
const MessagePrefix = "walcount"

// MessageTable is walcount's table of messages (state schema version 3)
// and MessageBodyColumn the column that holds a message's content. Every
// walcount publication includes the table.
const (
	MessageTable      = "walcount.messages"
	MessageBodyColumn = "body"
)

// RowQuerier reads one row; *pgx.Conn, *pgxpool.Pool and pgx.Tx fit.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// BatchSender sends a batch of statements; *pgx.Conn, *pgxpool.Pool and
// pgx.Tx fit.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// PostMessage sends one of the messages walcount acts on (a flush marker,
// a reconciliation marker, corrections): it inserts the content as a row
// of MessageTable and deletes the row again, in one transaction (q's, or
// the implicit transaction of the batch on a pool or connection). The
// insert reaches the stream with that transaction, as a trusted message
// event, and the table stays empty. Only a role that may write walcount's
// state can send one, unlike EmitMessage's (design rule 18).
func PostMessage(ctx context.Context, q BatchSender, content string) error {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("post message: %w", err)
	}
	id := int64(binary.BigEndian.Uint64(b[:]) >> 1)
	batch := &pgx.Batch{}
	batch.Queue("INSERT INTO walcount.messages (id, body) VALUES ($1, $2)", id, content)
	batch.Queue("DELETE FROM walcount.messages WHERE id = $1", id)
	if err := q.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("post message: %w", err)
	}
	return nil
}

// EmitMessage writes a transactional logical decoding message with
// walcount's prefix. It reaches the stream as a transaction of its own
// (unless q is inside a larger transaction) and returns the message's LSN.
// Any role may emit such a message, so walcount acts on none: heartbeats,
// which only need to be a transaction, use it, and so do waits for a
// position in the stream (design rule 18).
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
	// Piece names one piece of a big batch (several share an upto); empty
	// for a flush that moves W.
	Piece string `json:"piece,omitempty"`
}

// PieceMarker is FlushMarker for a piece of a big batch, named by piece
// (unique to the process that sent it), so that a restarted walcount can
// tell another process's pieces from its own.
func PieceMarker(slot string, upto LSN, piece string) string {
	b, _ := json.Marshal(flushMarker{Flush: upto.String(), Slot: slot, Piece: piece})
	return string(b)
}

// MarkerPiece returns the piece a flush marker names, "" for none.
func MarkerPiece(content []byte) string {
	var m flushMarker
	if err := json.Unmarshal(content, &m); err != nil {
		return ""
	}
	return m.Piece
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

// quietMessage is the content of the message that opens a transaction of
// a backfill's corrections written straight into a via table
// (reconcile's correctVia): the changes of that transaction are not
// deltas of the counters it names, the levels above the via table, whose
// own backfill comes after and counts the via rows as they are then.
type quietMessage struct {
	Quiet []string `json:"quiet"`
	Slot  string   `json:"slot"`
}

var quietTag = []byte(`"quiet":`)

// QuietMessage returns the content of the message that makes the rest of
// its transaction count nothing for counters of slot.
func QuietMessage(slot string, counters []string) string {
	b, _ := json.Marshal(quietMessage{Quiet: counters, Slot: slot})
	return string(b)
}

// ParseQuiet parses QuietMessage's content; ok is false for any other
// message.
func ParseQuiet(content []byte) (slot string, counters []string, ok bool) {
	if !bytes.Contains(content, quietTag) {
		return "", nil, false
	}
	var m quietMessage
	if err := json.Unmarshal(content, &m); err != nil || m.Quiet == nil {
		return "", nil, false
	}
	return m.Slot, m.Quiet, true
}
