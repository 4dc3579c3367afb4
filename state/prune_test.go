package state

import (
	"context"
	"testing"
)

// TestPruneKeepsTheNewestFinishedRuns: Prune deletes a slot's oldest
// finished runs beyond keep, never a pending or running one nor another
// slot's.
func TestPruneKeepsTheNewestFinishedRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, _, err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, slot := range []string{"s", "other"} {
		if _, err := db.Exec(ctx, `INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at) VALUES ($1, '0/1', now())`, slot); err != nil {
			t.Fatal(err)
		}
		runs := NewRuns(db, slot)
		for i := 0; i < 8; i++ {
			if _, err := runs.Create(ctx, "full", []string{"likes"}, false, 10); err != nil {
				t.Fatal(err)
			}
		}
		// Runs 1-6 finished (one failed), 7 running, 8 pending.
		if _, err := db.Exec(ctx, `UPDATE walcount.reconcile_runs r SET status = CASE WHEN n = 3 THEN 'failed' WHEN n <= 6 THEN 'done' WHEN n = 7 THEN 'running' ELSE status END
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM walcount.reconcile_runs WHERE slot_name = $1) o WHERE o.id = r.id`, slot); err != nil {
			t.Fatal(err)
		}
	}
	deleted, err := NewRuns(db, "s").Prune(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 4 {
		t.Errorf("Prune deleted %d runs; want the 4 oldest finished", deleted)
	}
	var left []string
	if err := db.QueryRow(ctx, `SELECT array_agg(status ORDER BY id) FROM walcount.reconcile_runs WHERE slot_name = 's'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if want := []string{"done", "done", "running", "pending"}; len(left) != len(want) || left[0] != want[0] || left[1] != want[1] || left[2] != want[2] || left[3] != want[3] {
		t.Errorf("left %v; want %v", left, want)
	}
	var other int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM walcount.reconcile_runs WHERE slot_name = 'other'`).Scan(&other); err != nil || other != 8 {
		t.Errorf("the other slot has %d runs (%v); want its 8", other, err)
	}
}
