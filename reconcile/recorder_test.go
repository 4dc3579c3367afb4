package reconcile

import (
	"iter"
	"maps"
	"testing"
)

// TestEvaluate checks correction(k) = truth(k) − column(k) − pending(k),
// where pending counts recorded transactions past W_S that S sees.
func TestEvaluate(t *testing.T) {
	snap, _ := ParseSnapshot("100:110:105")
	m := &measurement{
		counter: "c",
		keys:    []string{"a", "b", "c", "d"},
		snap:    snap,
		ws:      1000,
		truth:   map[string]int64{"a": 10, "b": 5, "c": 7, "d": 3},
		column:  map[string]int64{"a": 8, "b": 5, "c": 7, "d": 1},
		records: []txnRecord{
			{xid: 101, end: 1100, deltas: map[string]int64{"a": 2}},  // visible, past W_S: pending
			{xid: 99, end: 900, deltas: map[string]int64{"b": 4}},    // at or below W_S: in the column
			{xid: 105, end: 1200, deltas: map[string]int64{"c": 1}},  // in progress in S: not in the truth
			{xid: 111, end: 1300, deltas: map[string]int64{"c": -1}}, // after S
		},
		prev:  map[string]int64{"d": 2},
		apply: true,
	}
	out := m.evaluate()
	if len(out.drift) != 1 {
		t.Fatalf("drift = %+v, want only d", out.drift)
	}
	d := out.drift["d"]
	if d.Correction != 2 || d.Cached != 1 || d.True != 3 {
		t.Fatalf("drift of d = %+v", d)
	}
	if len(out.applied) != 1 || out.applied[0].Key != "d" {
		t.Fatalf("applied = %+v", out.applied)
	}

	// A second measurement that disagrees with the first applies nothing.
	m.prev = map[string]int64{"d": 5}
	if out := m.evaluate(); len(out.applied) != 0 {
		t.Fatalf("applied %+v although the measurements disagree", out.applied)
	}
	// Without apply (a dry run) nothing is applied either.
	m.prev, m.apply = map[string]int64{"d": 2}, false
	if out := m.evaluate(); len(out.applied) != 0 {
		t.Fatalf("dry run applied %+v", out.applied)
	}
}

func TestRecorderFollowsMarkers(t *testing.T) {
	r := NewRecorder("s", nil)
	m := &measurement{id: "m1", counter: "c", keys: []string{"1", "2"}}
	if err := r.register(m); err != nil {
		t.Fatal(err)
	}
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
	r.Observe(61, 300, seq(map[string]int64{"c:1": 1, "c:9": 1, "other:1": 1}), nil, nil)
	// Another slot's marker is ignored.
	if ds, _ := r.HandleMessage(0, 62, []byte(`{"reconcile":"m1","phase":1,"slot":"other"}`)); ds != nil {
		t.Fatal("handled another slot's marker")
	}
	if len(m.records) != 1 || m.records[0].deltas["1"] != 1 || len(m.records[0].deltas) != 1 {
		t.Fatalf("records = %+v, want only key 1 of counter c after M0", m.records)
	}
	snap, _ := ParseSnapshot("62:62:")
	r.setSnapshot(m, snap, 200, map[string]int64{"1": 1}, map[string]int64{"1": 0})
	if _, err := r.HandleMessage(0, 63, []byte(`{"reconcile":"m1","phase":1,"slot":"s"}`)); err != nil {
		t.Fatal(err)
	}
	<-m.done
	if m.err != nil || len(m.out.drift) != 0 {
		t.Fatalf("outcome = %+v, %v; want no drift", m.out, m.err)
	}

	// A new session fails measurements in flight.
	m2 := &measurement{id: "m2", counter: "c", keys: []string{"1"}}
	if err := r.register(m2); err != nil {
		t.Fatal(err)
	}
	r.NewSession()
	<-m2.done
	if m2.err == nil {
		t.Fatal("measurement survived a session restart")
	}
}

// seq turns a map into the iterator Observe takes.
func seq(m map[string]int64) iter.Seq2[string, int64] { return maps.All(m) }
