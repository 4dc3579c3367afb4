package cdc

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// msg builds pgoutput messages for tests.
type msg []byte

func (m msg) u8(v byte) msg     { return append(m, v) }
func (m msg) u16(v uint16) msg  { return binary.BigEndian.AppendUint16(m, v) }
func (m msg) u32(v uint32) msg  { return binary.BigEndian.AppendUint32(m, v) }
func (m msg) u64(v uint64) msg  { return binary.BigEndian.AppendUint64(m, v) }
func (m msg) str(s string) msg  { return append(append(m, s...), 0) }
func (m msg) text(s string) msg { return append(m.u8('t').u32(uint32(len(s))), s...) }

func relationMsg(id uint32, ident byte, cols ...string) []byte {
	m := msg{'R'}.u32(id).str("public").str("likes").u8(ident).u16(uint16(len(cols)))
	for i, c := range cols {
		flags := byte(0)
		if i == 0 {
			flags = 1
		}
		m = m.u8(flags).str(c).u32(20).u32(0xffffffff)
	}
	return m
}

func TestDecodeTransaction(t *testing.T) {
	d := NewDecoder()
	var b Batch
	commitUS := uint64(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Sub(postgresEpoch) / time.Microsecond)
	steps := [][]byte{
		msg{'B'}.u64(0x100).u64(commitUS).u32(777),
		relationMsg(42, 'f', "id", "post_id", "body"),
		msg{'I'}.u32(42).u8('N').u16(3).text("1").text("10").u8('n'),
		msg{'U'}.u32(42).u8('O').u16(3).text("1").text("10").u8('u').u8('N').u16(3).text("1").text("11").u8('u'),
		msg{'D'}.u32(42).u8('K').u16(3).text("1").u8('n').u8('n'),
		msg{'T'}.u32(1).u8(0).u32(42),
		msg{'M'}.u8(1).u64(0x180).str("walcount").u32(2).u8('{').u8('}'),
		msg{'M'}.u8(0).u64(0x190).str("other").u32(0), // non-transactional: dropped
		msg{'C'}.u8(0).u64(0x100).u64(0x1a8).u64(commitUS),
	}
	for i, s := range steps {
		if err := d.Decode(s, &b); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	want := []Kind{KindBegin, KindChange, KindChange, KindChange, KindTruncate, KindMessage, KindCommit}
	if len(b.Events) != len(want) {
		t.Fatalf("got %d events, want %d", len(b.Events), len(want))
	}
	for i, k := range want {
		if b.Events[i].Kind != k {
			t.Errorf("event %d: kind %d, want %d", i, b.Events[i].Kind, k)
		}
	}
	begin := b.Events[0]
	if begin.Xid != 777 || begin.LSN != 0x100 || !begin.Time.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("begin = %+v", begin)
	}
	ins := b.Events[1]
	if ins.Op != OpInsert || ins.Rel.Name != "likes" || string(ins.New.Cols[1].Data) != "10" || ins.New.Cols[2].Kind != ValueNull || ins.Old.Present() {
		t.Errorf("insert = %+v", ins)
	}
	upd := b.Events[2]
	if upd.Op != OpUpdate || upd.OldIsKey || string(upd.Old.Cols[1].Data) != "10" || string(upd.New.Cols[1].Data) != "11" || upd.New.Cols[2].Kind != ValueUnchangedToast {
		t.Errorf("update = %+v", upd)
	}
	del := b.Events[3]
	if del.Op != OpDelete || !del.OldIsKey || string(del.Old.Cols[0].Data) != "1" || del.New.Present() {
		t.Errorf("delete = %+v", del)
	}
	if tr := b.Events[4]; len(tr.Rels) != 1 || tr.Rels[0].ID != 42 {
		t.Errorf("truncate = %+v", tr)
	}
	if m := b.Events[5]; m.Prefix != "walcount" || string(m.Content) != "{}" || m.LSN != 0x180 {
		t.Errorf("message = %+v", m)
	}
	if c := b.Events[6]; c.LSN != 0x1a8 || c.CommitLSN != 0x100 {
		t.Errorf("commit = %+v", c)
	}
	rel := d.Relation(42)
	if rel.ReplicaIdentity != 'f' || !rel.Columns[0].Key || rel.Columns[1].Key || rel.ColumnIndex("post_id") != 1 || rel.ColumnIndex("nope") != -1 {
		t.Errorf("relation = %+v", rel)
	}
}

func TestDecodeValuesSurviveArenaGrowth(t *testing.T) {
	d := NewDecoder()
	var b Batch
	if err := d.Decode(relationMsg(1, 'd', "id"), &b); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		v := string(rune('a' + i%26))
		if err := d.Decode(msg{'I'}.u32(1).u8('N').u16(1).text(v), &b); err != nil {
			t.Fatal(err)
		}
	}
	for i, ev := range b.Events {
		if got, want := string(ev.New.Cols[0].Data), string(rune('a'+i%26)); got != want {
			t.Fatalf("event %d: %q, want %q", i, got, want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"unknown type", []byte{'Z'}, ErrMalformed},
		{"short begin", msg{'B'}.u32(1), ErrMalformed},
		{"short commit", msg{'C'}.u8(0).u64(1), ErrMalformed},
		{"unknown relation", msg{'I'}.u32(99).u8('N').u16(0), ErrUnknownRelation},
		{"bad insert tag", msg{'I'}.u32(1).u8('X').u16(0), ErrMalformed},
		{"bad delete tag", msg{'D'}.u32(1).u8('N').u16(0), ErrMalformed},
		{"column longer than message", msg{'I'}.u32(1).u8('N').u16(1).u8('t').u32(50).u8('x'), ErrMalformed},
		{"binary column", msg{'I'}.u32(1).u8('N').u16(1).u8('b').u32(1).u8('x'), ErrMalformed},
		{"truncate count lies", msg{'T'}.u32(1000).u8(0).u32(1), ErrMalformed},
		{"message length lies", msg{'M'}.u8(1).u64(1).str("p").u32(10), ErrMalformed},
		{"unterminated string", msg{'R'}.u32(1).u8('p'), ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder()
			var b Batch
			if err := d.Decode(relationMsg(1, 'd', "id"), &b); err != nil {
				t.Fatal(err)
			}
			err := d.Decode(tc.data, &b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if len(b.Events) != 0 {
				t.Fatalf("events appended on error: %d", len(b.Events))
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(msg{'I'}.u32(1).u8('N').u16(1).text("5")))
	f.Add([]byte(msg{'U'}.u32(1).u8('K').u16(1).text("5").u8('N').u16(1).text("6")))
	f.Add([]byte(msg{'M'}.u8(1).u64(1).str("walcount").u32(1).u8('x')))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder()
		var b Batch
		_ = d.Decode(relationMsg(1, 'd', "id"), &b)
		_ = d.Decode(data, &b) // must not panic
	})
}

func BenchmarkDecodeInsert(b *testing.B) {
	d := NewDecoder()
	var batch Batch
	if err := d.Decode(relationMsg(1, 'f', "id", "post_id", "user_id", "created_at"), &batch); err != nil {
		b.Fatal(err)
	}
	ins := msg{'I'}.u32(1).u8('N').u16(4).text("123456").text("42").text("99").text("2026-11-30 06:39:45.123+00")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%4096 == 0 {
			batch.reset()
		}
		if err := d.Decode(ins, &batch); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodeTrustedMessages: an insert into walcount's table of messages
// becomes a trusted message event; its delete, an update and every row
// of another table stay what they are; a logical message is never
// trusted.
func TestDecodeTrustedMessages(t *testing.T) {
	d := NewDecoder()
	d.TrustMessages(7)
	var b Batch
	body := `{"flush":"0/10","slot":"walcount"}`
	steps := [][]byte{
		relationMsg(7, 'd', "id", "body"),
		relationMsg(8, 'd', "id", "body"),
		msg{'I'}.u32(7).u8('N').u16(2).text("1").text(body),
		msg{'D'}.u32(7).u8('K').u16(2).text("1").u8('n'),
		msg{'U'}.u32(7).u8('N').u16(2).text("1").text("x"),
		msg{'I'}.u32(8).u8('N').u16(2).text("1").text(body),
		append(msg{'M'}.u8(1).u64(0x180).str("walcount").u32(uint32(len(body))), body...),
	}
	for i, s := range steps {
		if err := d.Decode(s, &b); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if len(b.Events) != 3 {
		t.Fatalf("got %d events, want 3: the message row, the other table's insert, the logical message", len(b.Events))
	}
	if ev := b.Events[0]; ev.Kind != KindMessage || !ev.Trusted || ev.Prefix != MessagePrefix || string(ev.Content) != body {
		t.Errorf("message row = %+v, want a trusted message with the row's body", ev)
	}
	if ev := b.Events[1]; ev.Kind != KindChange || ev.Trusted {
		t.Errorf("other table's insert = %+v, want a change", ev)
	}
	if ev := b.Events[2]; ev.Kind != KindMessage || ev.Trusted || string(ev.Content) != body {
		t.Errorf("logical message = %+v, want an untrusted message", ev)
	}

	// A row without its body is malformed, not a message.
	d2 := NewDecoder()
	d2.TrustMessages(7)
	if err := d2.Decode(relationMsg(7, 'd', "id", "other"), &b); err != nil {
		t.Fatal(err)
	}
	if err := d2.Decode(msg{'I'}.u32(7).u8('N').u16(2).text("1").text(body), &b); !errors.Is(err, ErrMalformed) {
		t.Errorf("row without body: err = %v, want ErrMalformed", err)
	}
}
