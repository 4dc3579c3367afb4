package aggregator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	dto "github.com/prometheus/client_model/go"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// likes(id, post_id, state, weight) with REPLICA IDENTITY FULL.
var likesRel = &cdc.Relation{
	ID: 1, Namespace: "public", Name: "likes", ReplicaIdentity: 'f',
	Columns: []cdc.Column{{Name: "id", Key: true}, {Name: "post_id"}, {Name: "state"}, {Name: "weight"}},
}

func txt(s string) cdc.Value { return cdc.Value{Kind: cdc.ValueText, Data: []byte(s)} }

var (
	null  = cdc.Value{Kind: cdc.ValueNull}
	toast = cdc.Value{Kind: cdc.ValueUnchangedToast}
)

func row(post cdc.Value, state cdc.Value, weight cdc.Value) cdc.Tuple {
	return cdc.Tuple{Cols: []cdc.Value{txt("1"), post, state, weight}}
}

func strp(s string) *string { return &s }

var (
	countAll = counter.Counter{Name: "likes", Source: "public.likes", Key: "post_id"}
	active   = counter.Counter{Name: "active", Source: "likes", Key: "post_id", Where: map[string]*string{"state": strp("active")}}
	undone   = counter.Counter{Name: "undone", Source: "likes", Key: "post_id", Where: map[string]*string{"state": nil}}
	weights  = counter.Counter{Name: "weight", Source: "likes", Key: "post_id", Sum: "weight"}
)

func TestRuleAlgebra(t *testing.T) {
	tests := []struct {
		name     string
		counters []counter.Counter
		op       cdc.Op
		old, new cdc.Tuple
		want     map[string]int64
	}{
		{"insert counts", []counter.Counter{countAll}, cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, null), map[string]int64{"likes:7": 1}},
		{"delete uncounts", []counter.Counter{countAll}, cdc.OpDelete, row(txt("7"), null, null), cdc.Tuple{}, map[string]int64{"likes:7": -1}},
		{"insert with null key counts nowhere", []counter.Counter{countAll}, cdc.OpInsert, cdc.Tuple{}, row(null, null, null), map[string]int64{}},
		{"move between posts", []counter.Counter{countAll}, cdc.OpUpdate, row(txt("7"), null, null), row(txt("8"), null, null), map[string]int64{"likes:7": -1, "likes:8": 1}},
		{"no-op update", []counter.Counter{countAll, active, weights}, cdc.OpUpdate, row(txt("7"), txt("active"), txt("3")), row(txt("7"), txt("active"), txt("3")), map[string]int64{}},
		{"key set from null", []counter.Counter{countAll}, cdc.OpUpdate, row(null, null, null), row(txt("8"), null, null), map[string]int64{"likes:8": 1}},
		{"enters filter", []counter.Counter{active}, cdc.OpUpdate, row(txt("7"), txt("deleted"), null), row(txt("7"), txt("active"), null), map[string]int64{"active:7": 1}},
		{"leaves filter", []counter.Counter{active}, cdc.OpUpdate, row(txt("7"), txt("active"), null), row(txt("7"), txt("deleted"), null), map[string]int64{"active:7": -1}},
		{"leaves filter and moves", []counter.Counter{active}, cdc.OpUpdate, row(txt("7"), txt("active"), null), row(txt("8"), txt("gone"), null), map[string]int64{"active:7": -1}},
		{"moves inside filter", []counter.Counter{active}, cdc.OpUpdate, row(txt("7"), txt("active"), null), row(txt("8"), txt("active"), null), map[string]int64{"active:7": -1, "active:8": 1}},
		{"is null filter: soft delete", []counter.Counter{undone}, cdc.OpUpdate, row(txt("7"), null, null), row(txt("7"), txt("x"), null), map[string]int64{"undone:7": -1}},
		{"is null filter: restore", []counter.Counter{undone}, cdc.OpUpdate, row(txt("7"), txt("x"), null), row(txt("7"), null, null), map[string]int64{"undone:7": 1}},
		{"sum insert", []counter.Counter{weights}, cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, txt("5")), map[string]int64{"weight:7": 5}},
		{"sum of null is zero", []counter.Counter{weights}, cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, null), map[string]int64{}},
		{"sum changes", []counter.Counter{weights}, cdc.OpUpdate, row(txt("7"), null, txt("5")), row(txt("7"), null, txt("-2")), map[string]int64{"weight:7": -7}},
		{"sum moves", []counter.Counter{weights}, cdc.OpUpdate, row(txt("7"), null, txt("5")), row(txt("8"), null, txt("6")), map[string]int64{"weight:7": -5, "weight:8": 6}},
		{"sum delete", []counter.Counter{weights}, cdc.OpDelete, row(txt("7"), null, txt("5")), cdc.Tuple{}, map[string]int64{"weight:7": -5}},
		{"unchanged toast key takes old value", []counter.Counter{countAll}, cdc.OpUpdate, row(txt("7"), txt("a"), null), row(toast, txt("b"), null), map[string]int64{}},
		{"unchanged toast filter takes old value", []counter.Counter{active}, cdc.OpUpdate, row(txt("7"), txt("active"), null), row(txt("8"), toast, null), map[string]int64{"active:7": -1, "active:8": 1}},
		{"several counters at once", []counter.Counter{countAll, active, weights}, cdc.OpInsert, cdc.Tuple{}, row(txt("7"), txt("active"), txt("2")), map[string]int64{"likes:7": 1, "active:7": 1, "weight:7": 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Options{Counters: tc.counters})
			ev := cdc.Event{Kind: cdc.KindChange, Op: tc.op, Rel: likesRel, Old: tc.old, New: tc.new}
			if err := a.change(&ev); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(a.txn.toMap(), tc.want) {
				t.Fatalf("deltas = %v, want %v", a.txn.toMap(), tc.want)
			}
		})
	}
}

// TestExtremumRule: a change of a key's rows for a max counter is a
// recompute (+1) of each key involved, never a negative delta; a change of
// nothing it reads is none; NULL values count nowhere; a correction or a
// crossing undone (add) counts +1 too.
func TestExtremumRule(t *testing.T) {
	latest := counter.Counter{Name: "latest", Source: "likes", Key: "post_id", Max: "weight", Where: map[string]*string{"state": strp("active")}}
	tests := []struct {
		name     string
		op       cdc.Op
		old, new cdc.Tuple
		want     map[string]int64
	}{
		{"insert", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), txt("active"), txt("5")), map[string]int64{"latest:7": 1}},
		{"insert of a null value", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), txt("active"), null), map[string]int64{}},
		{"insert outside the filter", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), txt("gone"), txt("5")), map[string]int64{}},
		{"delete", cdc.OpDelete, row(txt("7"), txt("active"), txt("5")), cdc.Tuple{}, map[string]int64{"latest:7": 1}},
		{"value lowered", cdc.OpUpdate, row(txt("7"), txt("active"), txt("5")), row(txt("7"), txt("active"), txt("2")), map[string]int64{"latest:7": 1}},
		{"value to null", cdc.OpUpdate, row(txt("7"), txt("active"), txt("5")), row(txt("7"), txt("active"), null), map[string]int64{"latest:7": 1}},
		{"leaves the filter", cdc.OpUpdate, row(txt("7"), txt("active"), txt("5")), row(txt("7"), txt("gone"), txt("5")), map[string]int64{"latest:7": 1}},
		{"moves", cdc.OpUpdate, row(txt("7"), txt("active"), txt("5")), row(txt("8"), txt("active"), txt("5")), map[string]int64{"latest:7": 1, "latest:8": 1}},
		{"unchanged", cdc.OpUpdate, row(txt("7"), txt("active"), txt("5")), row(txt("7"), txt("active"), txt("5")), map[string]int64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Options{Counters: []counter.Counter{latest, countAll}})
			ev := cdc.Event{Kind: cdc.KindChange, Op: tc.op, Rel: likesRel, Old: tc.old, New: tc.new}
			if err := a.change(&ev); err != nil {
				t.Fatal(err)
			}
			got := a.txn.toMap()
			delete(got, "likes:7")
			delete(got, "likes:8")
			if !maps.Equal(got, tc.want) {
				t.Fatalf("deltas = %v, want %v", got, tc.want)
			}
		})
	}
	a := New(Options{Counters: []counter.Counter{latest, countAll}})
	a.add("latest:7", -12345)
	a.add("likes:7", -3)
	if got, want := a.txn.toMap(), map[string]int64{"latest:7": 1, "likes:7": -3}; !maps.Equal(got, want) {
		t.Fatalf("corrections = %v, want %v", got, want)
	}
}

func TestRuleErrors(t *testing.T) {
	byDefault := &cdc.Relation{ID: 2, Namespace: "public", Name: "likes", ReplicaIdentity: 'd',
		Columns: []cdc.Column{{Name: "id", Key: true}, {Name: "post_id"}}}
	// The identity lacks post_id: the counter is degraded, not stopped.
	// Inserts still count; deletes cannot be attributed and are left to
	// the reconciliation the daemon runs once the identity is back.
	var reports []string
	a := New(Options{Counters: []counter.Counter{countAll}, Marks: degradedMarks(func(c string, degraded bool, why string) error {
		reports = append(reports, fmt.Sprintf("%s %v %s", c, degraded, why))
		return nil
	})})
	ev := cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: byDefault, New: cdc.Tuple{Cols: []cdc.Value{txt("1"), txt("2")}}}
	if err := a.change(&ev); err != nil {
		t.Fatalf("insert under a default identity without post_id: %v", err)
	}
	ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpDelete, Rel: byDefault, Old: cdc.Tuple{Cols: []cdc.Value{txt("1"), {Kind: cdc.ValueNull}}}, OldIsKey: true}
	if err := a.change(&ev); err != nil {
		t.Fatalf("delete under a default identity without post_id: %v", err)
	}
	if got := a.txn.toMap(); len(got) != 1 || got[countAll.Name+":2"] != 1 {
		t.Fatalf("deltas = %v, want the insert's +1 only", got)
	}
	if len(reports) != 1 || !strings.Contains(reports[0], "true") || !strings.Contains(reports[0], `column "post_id" of public.likes is not in its replica identity`) {
		t.Fatalf("degraded reports = %q, want one naming post_id", reports)
	}
	fixed := &cdc.Relation{ID: 2, Namespace: "public", Name: "likes", ReplicaIdentity: 'f', Columns: byDefault.Columns}
	ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: fixed, New: cdc.Tuple{Cols: []cdc.Value{txt("3"), txt("2")}}}
	if err := a.change(&ev); err != nil || len(reports) != 2 || !strings.Contains(reports[1], "false") {
		t.Fatalf("after the identity came back: err = %v, reports %q; want the counter keepable again", err, reports)
	}

	a = New(Options{Counters: []counter.Counter{countAll}})
	ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpUpdate, Rel: likesRel, Old: row(toast, null, null), New: row(toast, null, null)}
	if err := a.change(&ev); !errors.Is(err, ErrNotAttributable) {
		t.Fatalf("toasted key on both sides: err = %v, want ErrNotAttributable", err)
	}

	// An UPDATE without an old row whose new row leaves a counted column
	// out as unchanged TOAST: there is no value to read anywhere.
	// PostgreSQL 15 logs the old key whenever an identity column is
	// stored out of line, so this is a guard, not a path.
	for _, c := range []counter.Counter{countAll, active} {
		a = New(Options{Counters: []counter.Counter{c}})
		ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpUpdate, Rel: likesRel, New: row(toast, toast, null)}
		if err := a.change(&ev); !errors.Is(err, ErrNotAttributable) || !strings.Contains(err.Error(), "unchanged TOASTed value") {
			t.Fatalf("counter %s: toasted column and no old row: err = %v, want ErrNotAttributable", c.Name, err)
		}
	}

	a = New(Options{Counters: []counter.Counter{weights}})
	ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: likesRel, New: row(txt("7"), null, txt("1.5"))}
	if err := a.change(&ev); !errors.Is(err, counter.ErrBadValue) {
		t.Fatalf("fractional sum: err = %v, want counter.ErrBadValue", err)
	}

	missing := counter.Counter{Name: "x", Source: "likes", Key: "nope"}
	a = New(Options{Counters: []counter.Counter{missing}})
	ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: likesRel, New: row(txt("7"), null, null)}
	if err := a.change(&ev); !errors.Is(err, ErrNotAttributable) {
		t.Fatalf("missing key column: err = %v, want ErrNotAttributable", err)
	}
	for _, c := range []counter.Counter{
		{Name: "s", Source: "likes", Key: "post_id", Sum: "gone"},
		{Name: "w", Source: "likes", Key: "post_id", Where: map[string]*string{"gone": nil}},
	} {
		a = New(Options{Counters: []counter.Counter{c}})
		if err := a.change(&ev); !errors.Is(err, ErrNotAttributable) || !strings.Contains(err.Error(), `"gone"`) {
			t.Fatalf("counter %s with a missing column: err = %v, want ErrNotAttributable naming it", c.Name, err)
		}
	}
}

// recordingBuffer keeps the batches written to it, for the coalescing
// tests; the Redis side of the protocol is tested against a real server.
type recordingBuffer struct {
	batches []recorded
}

type recorded struct {
	prev, last cdc.LSN
	deltas     map[string]int64
}

func (r *recordingBuffer) Apply(_ context.Context, prev, last cdc.LSN, _ []counter.Move, ds []counter.Delta) (bool, error) {
	m := map[string]int64{}
	for _, d := range ds {
		m[d.Field] += d.N
	}
	r.batches = append(r.batches, recorded{prev, last, m})
	return true, nil
}

type recordingBarrier struct {
	end    cdc.LSN
	reset  []string
	deltas map[string]int64
}

func (r *recordingBarrier) Barrier(_ context.Context, end cdc.LSN, reset []string, ds []counter.Delta) error {
	r.end, r.reset, r.deltas = end, reset, map[string]int64{}
	for _, d := range ds {
		r.deltas[d.Field] += d.N
	}
	return nil
}

func txn(xid uint32, final, end cdc.LSN, changes ...cdc.Event) []cdc.Event {
	evs := []cdc.Event{{Kind: cdc.KindBegin, Xid: xid, LSN: final}}
	evs = append(evs, changes...)
	return append(evs, cdc.Event{Kind: cdc.KindCommit, LSN: end, CommitLSN: final})
}

func ins(post string) cdc.Event {
	return cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: likesRel, New: row(txt(post), null, null)}
}

func del(post string) cdc.Event {
	return cdc.Event{Kind: cdc.KindChange, Op: cdc.OpDelete, Rel: likesRel, Old: row(txt(post), null, null)}
}

func TestCoalescingAndSkipping(t *testing.T) {
	ctx := context.Background()
	buf := &recordingBuffer{}
	a := New(Options{Counters: []counter.Counter{countAll}, Buffer: buf, Start: 0x200})
	var evs []cdc.Event
	evs = append(evs, txn(1, 0x100, 0x150, ins("1"))...)           // replayed: below Start
	evs = append(evs, txn(2, 0x1f0, 0x200, ins("1"))...)           // replayed: ends at Start
	evs = append(evs, txn(3, 0x300, 0x350, ins("1"), ins("1"))...) // new
	evs = append(evs, txn(4, 0x400, 0x450, ins("2"), del("1"))...)
	evs = append(evs, txn(5, 0x500, 0x550, ins("3"), del("3"))...) // nets to nothing
	if err := a.Process(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(buf.batches) != 1 {
		t.Fatalf("%d redis writes, want 1 coalesced batch", len(buf.batches))
	}
	got := buf.batches[0]
	want := map[string]int64{"likes:1": 1, "likes:2": 1}
	if got.prev != 0x200 || got.last != 0x550 || !maps.Equal(got.deltas, want) {
		t.Fatalf("batch = %+v, want (0x200, 0x550] %v", got, want)
	}

	// Resent transactions after the batch are skipped too.
	if err := a.Process(ctx, txn(4, 0x400, 0x450, ins("9"))); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(buf.batches) != 1 {
		t.Fatalf("a replayed transaction was written: %+v", buf.batches[1:])
	}
}

func TestHeartbeatOnlyBatchMovesTheChain(t *testing.T) {
	ctx := context.Background()
	buf := &recordingBuffer{}
	a := New(Options{Counters: []counter.Counter{countAll}, Buffer: buf, Start: 0x10})
	msgEv := cdc.Event{Kind: cdc.KindMessage, Prefix: cdc.MessagePrefix, Content: []byte(`{"heartbeat":"x"}`)}
	if err := a.Process(ctx, txn(9, 0x20, 0x30, msgEv)); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(buf.batches) != 1 || buf.batches[0].last != 0x30 || len(buf.batches[0].deltas) != 0 {
		t.Fatalf("batches = %+v, want one empty batch up to 0x30", buf.batches)
	}
}

func TestTruncateIsABarrier(t *testing.T) {
	ctx := context.Background()
	buf := &recordingBuffer{}
	bar := &recordingBarrier{}
	a := New(Options{Counters: []counter.Counter{countAll, weights}, Buffer: buf, Barrier: bar, Start: 0x10})
	trunc := cdc.Event{Kind: cdc.KindTruncate, Rels: []*cdc.Relation{likesRel}}
	evs := txn(1, 0x20, 0x30, ins("1"))
	evs = append(evs, txn(2, 0x40, 0x50, ins("5"), trunc, ins("2"))...)
	if err := a.Process(ctx, evs); err != nil {
		t.Fatal(err)
	}
	// The batch before the barrier was written first, then the barrier.
	if len(buf.batches) != 1 || buf.batches[0].last != 0x30 {
		t.Fatalf("pre-barrier batches = %+v", buf.batches)
	}
	if bar.end != 0x50 || len(bar.reset) != 2 {
		t.Fatalf("barrier = %+v", bar)
	}
	want := map[string]int64{"likes:2": 1}
	if !maps.Equal(bar.deltas, want) {
		t.Fatalf("barrier deltas = %v, want %v (the insert before the truncate is erased)", bar.deltas, want)
	}
	if a.Position() != 0x50 {
		t.Fatalf("position = %s, want 0/50", a.Position())
	}
}

func TestFilterValuesAreCanonicalised(t *testing.T) {
	rel := &cdc.Relation{ID: 9, Namespace: "public", Name: "likes", ReplicaIdentity: 'f',
		Columns: []cdc.Column{{Name: "post_id", TypeOID: pgtype.Int8OID}, {Name: "visible", TypeOID: pgtype.BoolOID}, {Name: "kind", TypeOID: pgtype.Int4OID}}}
	c := counter.Counter{Name: "v", Source: "likes", Key: "post_id", Where: map[string]*string{"visible": strp("true"), "kind": strp("007")}}
	a := New(Options{Counters: []counter.Counter{c}})
	ev := cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: rel, New: cdc.Tuple{Cols: []cdc.Value{txt("5"), txt("t"), txt("7")}}}
	if err := a.change(&ev); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"v:5": 1}; !maps.Equal(a.txn.toMap(), want) {
		t.Fatalf("deltas = %v, want %v", a.txn.toMap(), want)
	}
}

// numericTypmod is the type modifier of numeric(p,s).
func numericTypmod(p, s int) int32 { return int32(p<<16|s&0x7ff) + 4 }

// likesNumeric is likes with weight numeric(12,2).
var likesNumeric = &cdc.Relation{
	ID: 3, Namespace: "public", Name: "likes", ReplicaIdentity: 'f',
	Columns: []cdc.Column{{Name: "id", Key: true, TypeOID: pgtype.Int8OID}, {Name: "post_id", TypeOID: pgtype.Int8OID},
		{Name: "state", TypeOID: 25}, {Name: "weight", TypeOID: pgtype.NumericOID, TypMod: numericTypmod(12, 2)}},
}

func TestNumericSumAlgebra(t *testing.T) {
	tests := []struct {
		name     string
		op       cdc.Op
		old, new cdc.Tuple
		want     map[string]int64
	}{
		{"insert", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, txt("12.50")), map[string]int64{"weight:7": 1250}},
		{"insert negative", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, txt("-0.01")), map[string]int64{"weight:7": -1}},
		{"insert zero", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, txt("0.00")), map[string]int64{}},
		{"insert null", cdc.OpInsert, cdc.Tuple{}, row(txt("7"), null, null), map[string]int64{}},
		{"delete", cdc.OpDelete, row(txt("7"), null, txt("3.25")), cdc.Tuple{}, map[string]int64{"weight:7": -325}},
		{"weight changes", cdc.OpUpdate, row(txt("7"), null, txt("3.25")), row(txt("7"), null, txt("3.30")), map[string]int64{"weight:7": 5}},
		{"weight to null", cdc.OpUpdate, row(txt("7"), null, txt("3.25")), row(txt("7"), null, null), map[string]int64{"weight:7": -325}},
		{"weight from null", cdc.OpUpdate, row(txt("7"), null, null), row(txt("7"), null, txt("1.00")), map[string]int64{"weight:7": 100}},
		{"weight same", cdc.OpUpdate, row(txt("7"), txt("a"), txt("3.25")), row(txt("7"), txt("b"), txt("3.25")), map[string]int64{}},
		{"moves with its weight", cdc.OpUpdate, row(txt("7"), null, txt("3.25")), row(txt("8"), null, txt("3.25")), map[string]int64{"weight:7": -325, "weight:8": 325}},
		{"moves and changes", cdc.OpUpdate, row(txt("7"), null, txt("3.25")), row(txt("8"), null, txt("0.75")), map[string]int64{"weight:7": -325, "weight:8": 75}},
		{"moves to null key", cdc.OpUpdate, row(txt("7"), null, txt("3.25")), row(null, null, txt("3.25")), map[string]int64{"weight:7": -325}},
		{"unchanged toast takes the old weight", cdc.OpUpdate, row(txt("7"), null, txt("3.25")), row(txt("8"), null, toast), map[string]int64{"weight:7": -325, "weight:8": 325}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Options{Counters: []counter.Counter{weights}})
			ev := cdc.Event{Kind: cdc.KindChange, Op: tc.op, Rel: likesNumeric, Old: tc.old, New: tc.new}
			if err := a.change(&ev); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(a.txn.toMap(), tc.want) {
				t.Fatalf("deltas = %v, want %v", a.txn.toMap(), tc.want)
			}
		})
	}
}

func TestNumericSumErrors(t *testing.T) {
	a := New(Options{Counters: []counter.Counter{weights}})
	ev := cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: likesNumeric, New: row(txt("7"), null, txt("1.005"))}
	if err := a.change(&ev); !errors.Is(err, counter.ErrBadValue) {
		t.Fatalf("three fractional digits at scale 2: err = %v, want counter.ErrBadValue", err)
	}
	a = New(Options{Counters: []counter.Counter{weights}})
	ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: likesNumeric, New: row(txt("7"), null, txt("NaN"))}
	if err := a.change(&ev); !errors.Is(err, counter.ErrBadValue) {
		t.Fatalf("NaN: err = %v, want counter.ErrBadValue", err)
	}

	for _, typmod := range []int32{-1, numericTypmod(30, 12)} {
		rel := *likesNumeric
		rel.ID = 4
		rel.Columns = append([]cdc.Column(nil), likesNumeric.Columns...)
		rel.Columns[3].TypMod = typmod
		a = New(Options{Counters: []counter.Counter{countAll, weights}})
		ev = cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: &rel, New: row(txt("7"), null, txt("1"))}
		err := a.change(&ev)
		if !errors.Is(err, counter.ErrUnsupportedSum) {
			t.Fatalf("typmod %d: err = %v, want counter.ErrUnsupportedSum", typmod, err)
		}
		if !strings.Contains(err.Error(), `ALTER TABLE public.likes ALTER COLUMN "weight" TYPE numeric(12,2)`) {
			t.Errorf("error does not say how to fix it: %v", err)
		}
	}
}

// countingBuffer counts Apply calls.
type countingBuffer struct{ calls atomic.Int64 }

func (c *countingBuffer) Apply(context.Context, cdc.LSN, cdc.LSN, []counter.Move, []counter.Delta) (bool, error) {
	c.calls.Add(1)
	return true, nil
}

// TestRunCoalescesSingleRowTransactions feeds transactions one batch at a
// time, as a live stream does: they reach Redis in few calls, and all of
// them within MaxPendingAge.
func TestRunCoalescesSingleRowTransactions(t *testing.T) {
	buf := &countingBuffer{}
	a := New(Options{Counters: []counter.Counter{countAll}, Buffer: buf, MaxPendingAge: 200 * time.Millisecond})
	in := make(chan *cdc.Batch)
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background(), in, nil) }()
	for i := 0; i < 100; i++ {
		lsn := cdc.LSN(0x100 + 0x10*i)
		in <- &cdc.Batch{Events: txn(uint32(i), lsn, lsn+8, ins("1"))}
	}
	// Nothing more arrives: the age bound alone must write the batch.
	wait.Until(10*time.Second, 10*time.Millisecond, func() bool { return buf.calls.Load() != 0 })
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := buf.calls.Load(); n == 0 || n > 10 || a.Position() != 0x100+0x10*99+8 {
		t.Fatalf("%d Redis writes up to %s for 100 single-row transactions fed one by one; want a few coalesced ones covering all", n, a.Position())
	}
}

// degradedMarks is a Marks that hands Degraded to a func and drops the rest.
type degradedMarks func(counter string, degraded bool, why string) error

func (f degradedMarks) Dirty([]string, string) error         { return nil }
func (f degradedMarks) DirtyCounters([]string, string) error { return nil }
func (f degradedMarks) Degraded(c string, degraded bool, why string) error {
	return f(c, degraded, why)
}
func (f degradedMarks) Sync(context.Context) error { return nil }

// TestQuietTransaction: a trusted quiet message of this slot makes the
// rest of its transaction count nothing for the counters it names (a
// backfill's corrections of a via table); one of another slot, or one
// any role could have emitted (a forgery, counted as such), changes
// nothing, and the next transaction counts again.
func TestQuietTransaction(t *testing.T) {
	ctx := context.Background()
	buf := &recordingBuffer{}
	a := New(Options{Slot: "s", Counters: []counter.Counter{countAll}, Buffer: buf, Start: 0x10})
	quiet := func(slot string, trusted bool) cdc.Event {
		return cdc.Event{Kind: cdc.KindMessage, Prefix: cdc.MessagePrefix, Trusted: trusted,
			Content: []byte(cdc.QuietMessage(slot, []string{countAll.Name}))}
	}
	var evs []cdc.Event
	evs = append(evs, txn(1, 0x20, 0x30, quiet("s", true), ins("1"), ins("2"))...) // quiet
	evs = append(evs, txn(2, 0x40, 0x50, ins("1"))...)                             // counted again
	evs = append(evs, txn(3, 0x60, 0x70, quiet("other", true), ins("3"))...)       // another slot's
	evs = append(evs, txn(4, 0x80, 0x90, quiet("s", false), ins("4"))...)          // forged
	if err := a.Process(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{countAll.Name + ":1": 1, countAll.Name + ":3": 1, countAll.Name + ":4": 1}
	if len(buf.batches) != 1 || !maps.Equal(buf.batches[0].deltas, want) {
		t.Fatalf("batches %+v, want one with %v", buf.batches, want)
	}
	var m dto.Metric
	if err := a.opt.Metrics.ForgedMessages.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("forged messages %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
}
