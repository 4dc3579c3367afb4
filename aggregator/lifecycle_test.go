package aggregator

import (
	"strings"
	"testing"
)

// TestFollow: where a flush's delta for f belonged after the lifecycle
// events it crossed. Whether its UPDATE hit a row is the statement's to
// say (TestFlushBlockedByDeleteAndReinsert).
func TestFollow(t *testing.T) {
	del := func(f string) lifeEvent { return lifeEvent{field: f} }
	ren := func(f, to string) lifeEvent { return lifeEvent{field: f, to: to} }
	ins := func(f string) lifeEvent { return lifeEvent{field: f, insert: true} }
	created := func(f string) lifeEvent { return lifeEvent{field: f, insert: true, own: true} }
	tests := []struct {
		name    string
		events  []lifeEvent
		should  string
		creates bool
	}{
		{"nothing happened to f", []lifeEvent{del("c:2")}, "c:1", false},
		{"deleted", []lifeEvent{del("c:1")}, "", false},
		{"deleted and inserted again", []lifeEvent{del("c:1"), ins("c:1")}, "", false},
		{"renamed", []lifeEvent{ren("c:1", "c:9")}, "c:9", false},
		{"renamed, and a new row takes the key", []lifeEvent{ren("c:1", "c:9"), ins("c:1")}, "c:9", false},
		{"renamed and back", []lifeEvent{ren("c:1", "c:9"), ren("c:9", "c:1")}, "c:1", false},
		{"renamed, then deleted", []lifeEvent{ren("c:1", "c:9"), del("c:9")}, "", false},
		{"renamed twice", []lifeEvent{ren("c:1", "c:9"), ren("c:9", "c:7")}, "c:7", false},
		{"another row renamed onto the key", []lifeEvent{del("c:1"), ren("c:5", "c:1")}, "", false},
		{"inserted first: no row at the hand-over", []lifeEvent{ins("c:1")}, "", false},
		// create_missing: the delta of a key with no row belongs to the
		// row that takes the key next (the flush's own or the app's).
		{"created: the row inserted after the hand-over is the key's", []lifeEvent{ins("c:1")}, "c:1", true},
		{"created, then deleted", []lifeEvent{ins("c:1"), del("c:1")}, "", true},
		{"deleted, then created", []lifeEvent{del("c:1"), ins("c:1")}, "", true},
		// A row walcount created (another counter's create_missing, in
		// an earlier piece of the same batch) is the key's row for every
		// counter of the target.
		{"created by walcount", []lifeEvent{created("c:1")}, "c:1", false},
		{"created by walcount, then deleted", []lifeEvent{created("c:1"), del("c:1")}, "", false},
		{"deleted, then created by walcount", []lifeEvent{del("c:1"), created("c:1")}, "", false},
	}
	for _, tt := range tests {
		if should := follow("c:1", tt.events, tt.creates); should != tt.should {
			t.Errorf("%s: follow = %q; want %q", tt.name, should, tt.should)
		}
	}
}

// TestDeltaSetMove: a move takes a field's sum to another field, a drop
// zeroes it, and a field with nothing stays as it was.
func TestDeltaSetMove(t *testing.T) {
	d := newDeltaSet()
	d.add("c:1", 3)
	d.add("c:2", 4)
	d.add("c:9", 1)
	d.move("c:1", "c:9")
	d.move("c:2", "")
	d.move("c:5", "c:6")
	got := d.toMap()
	if len(got) != 1 || got["c:9"] != 4 {
		t.Fatalf("after the moves: %v, want c:9=4 only", got)
	}
}

// TestRedirectInTransaction: where a delta on a key goes after the
// transaction's own lifecycle events; "" is dropped.
func TestRedirectInTransaction(t *testing.T) {
	type step struct{ field, to string } // to "" deletes; field "+x" inserts x
	tests := []struct {
		name  string
		steps []step
		want  map[string]string
	}{
		{"deleted", []step{{"c:6", ""}}, map[string]string{"c:6": ""}},
		{"deleted, inserted again", []step{{"c:6", ""}, {"+c:6", ""}}, map[string]string{"c:6": "c:6"}},
		{"moved", []step{{"c:6", "c:9"}}, map[string]string{"c:6": "c:9", "c:9": "c:9"}},
		{"moved away, another row moved onto the key", []step{{"c:6", "c:9"}, {"c:5", "c:6"}},
			map[string]string{"c:6": "c:6", "c:5": "c:6", "c:9": "c:9"}},
		{"deleted, another row moved onto the key", []step{{"c:6", ""}, {"c:5", "c:6"}},
			map[string]string{"c:6": "c:6", "c:5": "c:6"}},
		{"moved and back", []step{{"c:6", "c:9"}, {"c:9", "c:6"}}, map[string]string{"c:6": "c:6", "c:9": "c:6"}},
	}
	for _, tt := range tests {
		a := &Aggregator{lc: newLifecycle(), txn: newDeltaSet()}
		for _, s := range tt.steps {
			if f, ok := strings.CutPrefix(s.field, "+"); ok {
				a.inserted(f)
			} else {
				a.renamed(s.field, s.to)
			}
		}
		for field, want := range tt.want {
			if got := a.lc.redirect(field); got != want {
				t.Errorf("%s: a delta on %s goes to %q, want %q", tt.name, field, got, want)
			}
		}
	}
}
