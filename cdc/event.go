package cdc

import (
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"
)

// LSN is a PostgreSQL WAL position.
type LSN = pglogrepl.LSN

// Kind says what an Event is.
type Kind uint8

// Event kinds, in the order they appear inside a transaction.
const (
	// KindBegin opens a transaction: Xid, LSN (the commit record's LSN,
	// pgoutput's final LSN) and Time are set.
	KindBegin Kind = iota + 1
	// KindChange is a row change: Op, Rel, Old and New are set.
	KindChange
	// KindTruncate truncates Rels.
	KindTruncate
	// KindMessage is a transactional logical decoding message: Prefix and
	// Content are set.
	KindMessage
	// KindCommit closes the transaction: LSN is its end LSN
	// (CommitMessage.TransactionEndLSN), CommitLSN and Time are set.
	KindCommit
)

// Op is the kind of a row change.
type Op uint8

// Row change operations.
const (
	OpInsert Op = iota + 1
	OpUpdate
	OpDelete
)

// String returns the lowercase name used in metrics.
func (o Op) String() string {
	switch o {
	case OpInsert:
		return "insert"
	case OpUpdate:
		return "update"
	case OpDelete:
		return "delete"
	}
	return "unknown"
}

// Event is one decoded pgoutput message of a transaction. Which fields are
// set depends on Kind. Tuples point into their Batch's arena and are valid
// as long as the Batch is.
type Event struct {
	Kind Kind
	Op   Op
	// Xid is the transaction id (Begin). It is the 32-bit xid that pgoutput
	// sends, without epoch.
	Xid uint32
	// LSN is the commit record's LSN for Begin, the transaction's end LSN
	// for Commit and the message's LSN for Message.
	LSN LSN
	// CommitLSN is set on Commit.
	CommitLSN LSN
	// Time is the commit time (Begin and Commit).
	Time time.Time
	// Rel is the changed relation (Change).
	Rel *Relation
	// Old is the old row or its replica identity key (Update, Delete);
	// Old.Present() is false when pgoutput sent no old tuple. OldIsKey is
	// true when Old carries only the replica identity columns ('K').
	Old      Tuple
	OldIsKey bool
	// New is the new row (Insert, Update).
	New Tuple
	// Rels are the truncated relations (Truncate).
	Rels []*Relation
	// Prefix and Content are the message's (Message).
	Prefix  string
	Content []byte
	// Trusted is set on a Message that came as a row of walcount's table
	// of messages (PostMessage), which only walcount's role may write. A
	// message of pg_logical_emit_message (EmitMessage) is never trusted:
	// any role may emit one.
	Trusted bool
}

// Batch is a run of events handed downstream in one channel send. The
// consumer owns it once received.
type Batch struct {
	Events []Event
	arena  []byte
	cols   []Value
	// content is the bytes of the events' message contents.
	content int64
	// charged is what the batch counts against the queue's byte budget
	// while it is handed over and not yet released.
	charged int64
}

// Sizes of the structures a batch holds, for its byte count.
var (
	eventSize = int64(unsafe.Sizeof(Event{}))
	valueSize = int64(unsafe.Sizeof(Value{}))
)

// bytes estimates the memory the batch holds: its events, column values,
// the arena of their text and message contents. It costs nothing to call
// after every message: the stream counts the contents as it decodes.
func (b *Batch) bytes() int64 {
	return int64(len(b.Events))*eventSize + int64(len(b.cols))*valueSize + int64(len(b.arena)) + b.content
}

// maxKeptArena is the arena capacity a released batch keeps for reuse; a
// larger one (a row wider than a batch's budget) is dropped, so that the
// pool of batches never holds more than a few budgets.
const maxKeptArena = 4 * DefaultBatchBytes

// reset empties b for reuse, keeping its capacity.
func (b *Batch) reset() {
	clear(b.Events) // drop pointers held by old events
	b.Events = b.Events[:0]
	b.arena = b.arena[:0]
	if cap(b.arena) > maxKeptArena {
		b.arena = nil
	}
	b.cols = b.cols[:0]
	b.content, b.charged = 0, 0
}

// ValueKind says how a column is present in a tuple.
type ValueKind uint8

// Column kinds as pgoutput sends them.
const (
	// ValueNull is an SQL NULL.
	ValueNull ValueKind = 'n'
	// ValueUnchangedToast is a TOASTed value that did not change; its
	// value is not sent. It is not NULL.
	ValueUnchangedToast ValueKind = 'u'
	// ValueText is a text-format value.
	ValueText ValueKind = 't'
)

// Value is one column of a tuple.
type Value struct {
	Kind ValueKind
	// Data is the text representation (Kind == ValueText).
	Data []byte
}

// Tuple is a decoded row: one Value per column of its Relation, in the
// relation's column order.
type Tuple struct {
	Cols []Value
}

// Present reports whether the tuple was sent at all.
func (t Tuple) Present() bool { return t.Cols != nil }

// Relation describes a published table as the RELATION message announced
// it. A Relation is immutable: a schema change produces a new one, so
// events decoded before it keep the description they were decoded with.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	// ReplicaIdentity is 'd' (default), 'n' (nothing), 'f' (full) or 'i'
	// (index).
	ReplicaIdentity byte
	Columns         []Column
}

// Column is a column of a Relation.
type Column struct {
	Name    string
	TypeOID uint32
	TypMod  int32
	// Key is true when the column is part of the replica identity.
	Key bool
}

// QualifiedName returns "namespace.name".
func (r *Relation) QualifiedName() string { return r.Namespace + "." + r.Name }

// ColumnIndex returns the position of the named column, or -1.
func (r *Relation) ColumnIndex(name string) int {
	for i, c := range r.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}
