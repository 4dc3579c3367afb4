package state

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/walcount/walcount/counter"
)

// TestForgetRemovedCounters: what a slot keeps for a counter that left the
// configuration goes (its backfill record, dirty marks, partitions and
// carried deltas), so that a counter of that name added again is
// backfilled; the kept counters' and other slots' rows stay.
func TestForgetRemovedCounters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, _, err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	kept, gone := counter.Default(), counter.Default()
	gone.Name, gone.Column = "gone", "other_count"
	for _, slot := range []string{"s", "other"} {
		if _, err := db.Exec(ctx, `INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at) VALUES ($1, '0/1', now())`, slot); err != nil {
			t.Fatal(err)
		}
		runs := NewRuns(db, slot)
		for _, c := range []counter.Counter{kept, gone} {
			if err := runs.Backfilled(ctx, c); err != nil {
				t.Fatal(err)
			}
			if err := MarkDirty(ctx, db, slot, c.Name, []string{"1"}, "test"); err != nil {
				t.Fatal(err)
			}
			if err := SaveLeaves(ctx, db, slot, c.Name, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := SaveCarried(ctx, db, slot, []Carried{{Counter: kept.Name, Key: "1", Delta: 1}, {Counter: gone.Name, Key: "1", Delta: 2}}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	both := []counter.Counter{kept, gone}
	if need, err := NewRuns(db, "s").NeedBackfill(ctx, both); err != nil || len(need) != 0 {
		t.Fatalf("before: NeedBackfill = %v, %v; want none", need, err)
	}

	forgot, err := NewRuns(db, "s").Forget(ctx, db, []string{kept.Name})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(forgot, []string{"gone"}) {
		t.Errorf("Forget = %v, want [gone]", forgot)
	}
	if need, err := NewRuns(db, "s").NeedBackfill(ctx, both); err != nil || !slices.Equal(need, []string{"gone"}) {
		t.Errorf("NeedBackfill after Forget = %v, %v; want [gone]: a counter added back must be backfilled", need, err)
	}
	if need, err := NewRuns(db, "other").NeedBackfill(ctx, both); err != nil || len(need) != 0 {
		t.Errorf("another slot's NeedBackfill = %v, %v; want none", need, err)
	}
	for _, table := range []string{"counters", "dirty", "partitions", "carried"} {
		col := "counter"
		if table == "counters" {
			col = "name"
		}
		var got []string
		rows, err := db.Query(ctx, `SELECT DISTINCT slot_name || ':' || `+col+` FROM walcount.`+table+` ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if want := []string{"other:gone", "other:post_likes", "s:post_likes"}; !slices.Equal(got, want) {
			t.Errorf("walcount.%s holds %v, want %v", table, got, want)
		}
	}
	if forgot, err := NewRuns(db, "s").Forget(ctx, db, []string{kept.Name}); err != nil || len(forgot) != 0 {
		t.Errorf("a second Forget = %v, %v; want nothing", forgot, err)
	}
}
