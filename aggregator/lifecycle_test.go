package aggregator

import "testing"

// TestFollow: where a flush's delta for f belonged, and whether its
// UPDATE hit a row with key f, after the lifecycle events it crossed.
func TestFollow(t *testing.T) {
	del := func(f string) lifeEvent { return lifeEvent{field: f} }
	ren := func(f, to string) lifeEvent { return lifeEvent{field: f, to: to} }
	ins := func(f string) lifeEvent { return lifeEvent{field: f, insert: true} }
	tests := []struct {
		name   string
		events []lifeEvent
		should string
		went   bool
	}{
		{"nothing happened to f", []lifeEvent{del("c:2")}, "c:1", true},
		{"deleted", []lifeEvent{del("c:1")}, "", false},
		{"deleted and inserted again", []lifeEvent{del("c:1"), ins("c:1")}, "", true},
		{"renamed", []lifeEvent{ren("c:1", "c:9")}, "c:9", false},
		{"renamed, and a new row takes the key", []lifeEvent{ren("c:1", "c:9"), ins("c:1")}, "c:9", true},
		{"renamed and back", []lifeEvent{ren("c:1", "c:9"), ren("c:9", "c:1")}, "c:1", true},
		{"renamed, then deleted", []lifeEvent{ren("c:1", "c:9"), del("c:9")}, "", false},
		{"renamed twice", []lifeEvent{ren("c:1", "c:9"), ren("c:9", "c:7")}, "c:7", false},
		{"another row renamed onto the key", []lifeEvent{del("c:1"), ren("c:5", "c:1")}, "", true},
		{"inserted first: no row at the hand-over", []lifeEvent{ins("c:1")}, "", true},
	}
	for _, tt := range tests {
		should, went := follow("c:1", tt.events)
		if should != tt.should || went != tt.went {
			t.Errorf("%s: follow = %q, %v; want %q, %v", tt.name, should, went, tt.should, tt.went)
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
