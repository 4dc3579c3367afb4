package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// pgoutput message type bytes (protocol version 1).
const (
	msgBegin    = 'B'
	msgCommit   = 'C'
	msgOrigin   = 'O'
	msgRelation = 'R'
	msgType     = 'Y'
	msgInsert   = 'I'
	msgUpdate   = 'U'
	msgDelete   = 'D'
	msgTruncate = 'T'
	msgMessage  = 'M'
)

var (
	// ErrMalformed is wrapped by every decoding error: the server sent
	// bytes that do not follow the pgoutput protocol.
	ErrMalformed = errors.New("malformed pgoutput message")
	// ErrUnknownRelation is wrapped when a change names a relation that no
	// RELATION message announced.
	ErrUnknownRelation = errors.New("change for unknown relation")
)

// postgresEpoch is 2000-01-01, the origin of PostgreSQL timestamps.
var postgresEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Decoder turns pgoutput messages into events. It caches RELATION
// messages; it is not safe for concurrent use.
type Decoder struct {
	rels map[uint32]*Relation
	// messages is the OID of walcount's table of messages; 0 when unknown.
	messages uint32
}

// NewDecoder returns a Decoder with an empty relation cache. A new
// replication session needs a new Decoder: the server resends RELATION
// messages on every session.
func NewDecoder() *Decoder {
	return &Decoder{rels: make(map[uint32]*Relation)}
}

// TrustMessages makes the rows inserted into the relation with OID rel
// walcount's own messages: each insert becomes a KindMessage event with
// Trusted set and the row's body as its Content (see PostMessage). Deletes
// and updates of that relation yield no event.
func (d *Decoder) TrustMessages(rel uint32) { d.messages = rel }

// Relation returns the cached relation with the given OID, or nil.
func (d *Decoder) Relation(id uint32) *Relation { return d.rels[id] }

// reader is a bounds-checked cursor over one message.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated %s", ErrMalformed, what)
	}
	r.b = nil
}

func (r *reader) u8(what string) byte {
	if len(r.b) < 1 {
		r.fail(what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16(what string) uint16 {
	if len(r.b) < 2 {
		r.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) u32(what string) uint32 {
	if len(r.b) < 4 {
		r.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64(what string) uint64 {
	if len(r.b) < 8 {
		r.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes(n int, what string) []byte {
	if n < 0 || len(r.b) < n {
		r.fail(what)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) cstring(what string) string {
	for i, c := range r.b {
		if c == 0 {
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		}
	}
	r.fail(what)
	return ""
}

func (r *reader) time(what string) time.Time {
	us := int64(r.u64(what))
	return postgresEpoch.Add(time.Duration(us) * time.Microsecond)
}

// Decode decodes one pgoutput message and appends the resulting event, if
// any, to b. RELATION messages update the cache and append nothing; so do
// TYPE and ORIGIN messages, which walcount does not need. Column values
// are copied into b's arena, because data is only valid until the next
// receive on the connection.
func (d *Decoder) Decode(data []byte, b *Batch) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty message", ErrMalformed)
	}
	r := reader{b: data[1:]}
	var ev Event
	switch data[0] {
	case msgBegin:
		ev.Kind = KindBegin
		ev.LSN = LSN(r.u64("begin final lsn"))
		ev.Time = r.time("begin commit time")
		ev.Xid = r.u32("begin xid")
	case msgCommit:
		ev.Kind = KindCommit
		r.u8("commit flags")
		ev.CommitLSN = LSN(r.u64("commit lsn"))
		ev.LSN = LSN(r.u64("commit end lsn"))
		ev.Time = r.time("commit time")
	case msgRelation:
		rel := d.decodeRelation(&r)
		if r.err != nil {
			return r.err
		}
		d.rels[rel.ID] = rel
		return nil
	case msgOrigin, msgType:
		return nil
	case msgInsert:
		ev.Kind, ev.Op = KindChange, OpInsert
		ev.Rel = d.relation(&r)
		if tag := r.u8("insert tuple tag"); r.err == nil && tag != 'N' {
			return fmt.Errorf("%w: insert tuple tag %q", ErrMalformed, tag)
		}
		ev.New = b.decodeTuple(&r)
		if r.err == nil && d.messages != 0 && ev.Rel.ID == d.messages {
			return d.message(&ev, b)
		}
	case msgUpdate:
		ev.Kind, ev.Op = KindChange, OpUpdate
		ev.Rel = d.relation(&r)
		tag := r.u8("update tuple tag")
		if tag == 'K' || tag == 'O' {
			ev.OldIsKey = tag == 'K'
			ev.Old = b.decodeTuple(&r)
			tag = r.u8("update new tuple tag")
		}
		if r.err == nil && tag != 'N' {
			return fmt.Errorf("%w: update tuple tag %q", ErrMalformed, tag)
		}
		ev.New = b.decodeTuple(&r)
		if r.err == nil && d.messages != 0 && ev.Rel.ID == d.messages {
			return nil
		}
	case msgDelete:
		ev.Kind, ev.Op = KindChange, OpDelete
		ev.Rel = d.relation(&r)
		tag := r.u8("delete tuple tag")
		if r.err == nil && tag != 'K' && tag != 'O' {
			return fmt.Errorf("%w: delete tuple tag %q", ErrMalformed, tag)
		}
		ev.OldIsKey = tag == 'K'
		ev.Old = b.decodeTuple(&r)
		if r.err == nil && d.messages != 0 && ev.Rel.ID == d.messages {
			return nil // every message row is deleted by the transaction that sent it
		}
	case msgTruncate:
		ev.Kind = KindTruncate
		n := r.u32("truncate relation count")
		r.u8("truncate options")
		if r.err == nil && uint64(n)*4 > uint64(len(r.b)) {
			return fmt.Errorf("%w: truncate of %d relations in %d bytes", ErrMalformed, n, len(r.b))
		}
		ev.Rels = make([]*Relation, 0, n)
		for i := uint32(0); i < n && r.err == nil; i++ {
			ev.Rels = append(ev.Rels, d.relation(&r))
		}
	case msgMessage:
		ev.Kind = KindMessage
		flags := r.u8("message flags")
		ev.LSN = LSN(r.u64("message lsn"))
		ev.Prefix = r.cstring("message prefix")
		n := r.u32("message length")
		content := r.bytes(int(n), "message content")
		if r.err == nil && flags&1 == 0 {
			// A non-transactional message is not part of any transaction
			// and cannot carry W: walcount only emits transactional ones.
			return nil
		}
		ev.Content = append([]byte(nil), content...)
	default:
		return fmt.Errorf("%w: unknown message type %q (is the slot using pgoutput protocol version 1?)", ErrMalformed, data[0])
	}
	if r.err != nil {
		return r.err
	}
	b.Events = append(b.Events, ev)
	return nil
}

// message turns the insert of a row of walcount's table of messages into
// a trusted KindMessage event. Its LSN is the insert's WAL position, which
// the stream sets from the XLogData header (pgoutput's insert message
// carries none).
func (d *Decoder) message(ev *Event, b *Batch) error {
	i := ev.Rel.ColumnIndex(MessageBodyColumn)
	if i < 0 || i >= len(ev.New.Cols) || ev.New.Cols[i].Kind != ValueText {
		return fmt.Errorf("%w: row of %s without a %s value", ErrMalformed, ev.Rel.QualifiedName(), MessageBodyColumn)
	}
	*ev = Event{
		Kind:    KindMessage,
		Prefix:  MessagePrefix,
		Content: append([]byte(nil), ev.New.Cols[i].Data...),
		Trusted: true,
	}
	b.Events = append(b.Events, *ev)
	return nil
}

// relation reads a relation OID and resolves it in the cache.
func (d *Decoder) relation(r *reader) *Relation {
	id := r.u32("relation id")
	if r.err != nil {
		return nil
	}
	rel := d.rels[id]
	if rel == nil && r.err == nil {
		r.err = fmt.Errorf("%w: oid %d", ErrUnknownRelation, id)
		r.b = nil
	}
	return rel
}

func (d *Decoder) decodeRelation(r *reader) *Relation {
	rel := &Relation{ID: r.u32("relation id")}
	rel.Namespace = r.cstring("relation namespace")
	if rel.Namespace == "" {
		// pgoutput sends an empty namespace for pg_catalog only.
		rel.Namespace = "pg_catalog"
	}
	rel.Name = r.cstring("relation name")
	rel.ReplicaIdentity = r.u8("relation replica identity")
	n := int(r.u16("relation column count"))
	if r.err != nil {
		return rel
	}
	rel.Columns = make([]Column, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		flags := r.u8("column flags")
		c := Column{Key: flags&1 == 1}
		c.Name = r.cstring("column name")
		c.TypeOID = r.u32("column type")
		c.TypMod = int32(r.u32("column typmod"))
		rel.Columns = append(rel.Columns, c)
	}
	return rel
}

// decodeTuple reads a TupleData into b's arenas: no allocation per column
// once the arenas have grown to the batch's working size.
func (b *Batch) decodeTuple(r *reader) Tuple {
	n := int(r.u16("tuple column count"))
	if r.err != nil {
		return Tuple{}
	}
	start := len(b.cols)
	for i := 0; i < n && r.err == nil; i++ {
		kind := ValueKind(r.u8("column kind"))
		v := Value{Kind: kind}
		switch kind {
		case ValueNull, ValueUnchangedToast:
		case ValueText:
			l := int(r.u32("column length"))
			data := r.bytes(l, "column value")
			off := len(b.arena)
			b.arena = append(b.arena, data...)
			// Full slice expression: a later append to the arena must
			// never write into this value's capacity.
			v.Data = b.arena[off:len(b.arena):len(b.arena)]
		default:
			if r.err == nil {
				r.err = fmt.Errorf("%w: column kind %q (binary mode is not used)", ErrMalformed, byte(kind))
				r.b = nil
			}
		}
		b.cols = append(b.cols, v)
	}
	if r.err != nil {
		return Tuple{}
	}
	cols := b.cols[start:len(b.cols):len(b.cols)]
	if cols == nil {
		cols = []Value{}
	}
	return Tuple{Cols: cols}
}
