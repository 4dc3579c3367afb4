package reconcile

import (
	"iter"
	"maps"
	"testing"

	"github.com/walcount/walcount/counter"
)

// TestPending checks pending(k): the recorded deltas of transactions past
// W_S that S sees, and the correction truth(k) − column(k) − pending(k)
// built on it.
func TestPending(t *testing.T) {
	snap, _ := ParseSnapshot("100:110:105")
	m := &measurement{
		counter: "c",
		snap:    snap,
		ws:      1000,
		records: []txnRecord{
			{xid: 101, end: 1100, deltas: map[string]int64{"a": 2}},          // visible, past W_S: pending
			{xid: 99, end: 900, deltas: map[string]int64{"b": 4}},            // at or below W_S: in the column
			{xid: 105, end: 1200, deltas: map[string]int64{"c": 1}},          // in progress in S: not in the truth
			{xid: 111, end: 1300, deltas: map[string]int64{"c": -1}},         // after S
			{xid: 102, end: 1150, deltas: map[string]int64{"e": 1, "a": 0}},  // visible
			{xid: 103, end: 1160, deltas: map[string]int64{"e": -1, "f": 3}}, // visible: e sums to 0
		},
	}
	got := m.pendingDeltas()
	want := map[string]int64{"a": 2, "f": 3}
	if !maps.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
	res := roundResult{
		truth:   map[string]int64{"a": 10, "b": 5, "d": 3},
		column:  map[string]int64{"a": 8, "b": 5, "d": 1, "z": 2},
		pending: got,
	}
	for _, tc := range []struct {
		key          string
		corr, cached int64
		ok           bool
	}{
		{"a", 0, 10, true}, // 10 − 8 − 2
		{"b", 0, 5, true},
		{"d", 2, 1, true},
		{"z", -2, 2, true}, // no source rows: the truth is 0
		{"x", 0, 0, false}, // no target row
	} {
		corr, cached, ok := res.correction(tc.key)
		if corr != tc.corr || cached != tc.cached || ok != tc.ok {
			t.Errorf("correction(%s) = %d, %d, %v; want %d, %d, %v", tc.key, corr, cached, ok, tc.corr, tc.cached, tc.ok)
		}
	}
}

func TestRecorderFollowsMarkers(t *testing.T) {
	r := NewRecorder("s", nil)
	m := &measurement{id: "m1", counter: "c"}
	r.register(m)
	// Transactions before M0 are not recorded.
	r.Observe(50, 100, seq(map[string]int64{"c:1": 1}), nil, nil)
	if _, err := r.HandleMessage(0, 60, []byte(`{"reconcile":"m1","phase":0,"slot":"s"}`)); err != nil {
		t.Fatal(err)
	}
	r.Observe(60, 200, seq(nil), nil, nil) // M0's own transaction
	select {
	case <-m.committed:
	default:
		t.Fatal("M0's commit did not start the recording")
	}
	r.Observe(61, 300, seq(map[string]int64{"c:1": 1, "c:9": 2, "other:1": 1}), nil, nil)
	r.Observe(64, 350, seq(map[string]int64{"c:5": 1}), nil, nil) // after S
	// Another slot's marker is ignored.
	if ds, _ := r.HandleMessage(0, 62, []byte(`{"reconcile":"m1","phase":1,"slot":"other"}`)); ds != nil {
		t.Fatal("handled another slot's marker")
	}
	if len(m.records) != 2 || m.records[0].deltas["1"] != 1 || m.records[0].deltas["9"] != 2 || len(m.records[0].deltas) != 2 {
		t.Fatalf("records = %+v, want the keys of counter c after M0", m.records)
	}
	snap, _ := ParseSnapshot("62:62:")
	r.setSnapshot(m, snap, 200)
	if _, err := r.HandleMessage(0, 63, []byte(`{"reconcile":"m1","phase":1,"slot":"s"}`)); err != nil {
		t.Fatal(err)
	}
	<-m.done
	if m.err != nil || !maps.Equal(m.pending, map[string]int64{"1": 1, "9": 2}) {
		t.Fatalf("pending = %v, %v; want keys 1 and 9 of the transaction S sees", m.pending, m.err)
	}

	// A new session fails measurements in flight.
	m2 := &measurement{id: "m2", counter: "c"}
	r.register(m2)
	r.NewSession()
	<-m2.done
	if m2.err == nil {
		t.Fatal("measurement survived a session restart")
	}
}

// TestRecorderMovesAndTruncates: a target lifecycle event marks its keys
// as moved; a TRUNCATE of the source fails the measurement.
func TestRecorderMovesAndTruncates(t *testing.T) {
	r := NewRecorder("s", nil)
	m := &measurement{id: "m1", counter: "c"}
	r.register(m)
	if _, err := r.HandleMessage(0, 60, []byte(`{"reconcile":"m1","phase":0,"slot":"s"}`)); err != nil {
		t.Fatal(err)
	}
	r.Observe(60, 200, seq(nil), nil, nil)
	r.Observe(61, 300, seq(nil), nil, []counter.Move{{Field: "c:7", To: "c:8"}, {Field: "other:3"}})
	if !maps.Equal(m.moved, map[string]bool{"7": true, "8": true}) {
		t.Fatalf("moved = %v, want keys 7 and 8", m.moved)
	}
	r.Observe(62, 400, seq(nil), map[string]bool{"c": true}, nil)
	snap, _ := ParseSnapshot("62:62:")
	r.setSnapshot(m, snap, 200)
	if _, err := r.HandleMessage(0, 63, []byte(`{"reconcile":"m1","phase":1,"slot":"s"}`)); err != nil {
		t.Fatal(err)
	}
	<-m.done
	if m.err == nil {
		t.Fatal("a measurement across a TRUNCATE succeeded")
	}
}

// seq turns a map into the iterator Observe takes.
func seq(m map[string]int64) iter.Seq2[string, int64] { return maps.All(m) }
