package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// preVersionSchema is the state a walcount of before the schema version
// left: setup made the schema and the checkpoint table, the daemon made
// the reconcile tables on its first start.
const preVersionSchema = `
CREATE SCHEMA IF NOT EXISTS walcount;
CREATE TABLE IF NOT EXISTS walcount.checkpoint (
    slot_name  text PRIMARY KEY,
    lsn        pg_lsn NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS walcount.reconcile_runs (
    id           bigserial PRIMARY KEY,
    slot_name    text NOT NULL,
    kind         text NOT NULL,
    counters     text[] NOT NULL,
    dry_run      boolean NOT NULL,
    batch_size   integer NOT NULL,
    status       text NOT NULL,
    cur_counter  text,
    last_key     text,
    total        bigint NOT NULL DEFAULT 0,
    keys_checked bigint NOT NULL DEFAULT 0,
    drifted      bigint NOT NULL DEFAULT 0,
    corrected    bigint NOT NULL DEFAULT 0,
    error        text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE TABLE IF NOT EXISTS walcount.counters (
    slot_name     text NOT NULL,
    name          text NOT NULL,
    definition    text NOT NULL,
    backfilled_at timestamptz,
    PRIMARY KEY (slot_name, name)
);
INSERT INTO walcount.checkpoint VALUES ('walcount', '0/1A2B3C4D', now() - interval '5 seconds');
INSERT INTO walcount.reconcile_runs (slot_name, kind, counters, dry_run, batch_size, status, last_key)
VALUES ('walcount', 'manual', '{post_likes}', false, 1000, 'running', '42');`

// TestMigrateFromPreVersionSchema upgrades the schema a running walcount
// of the previous release kept: the checkpoint and an unfinished run are
// preserved, the version is recorded, and a second migration is a no-op.
func TestMigrateFromPreVersionSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, err := db.Exec(ctx, preVersionSchema); err != nil {
		t.Fatal(err)
	}
	if v, err := ReadVersion(ctx, db); err != nil || v != 0 {
		t.Fatalf("ReadVersion before migrating = %d, %v; want 0", v, err)
	}
	if err := CheckVersion(ctx, db); !errors.Is(err, ErrSchemaVersion) || !strings.Contains(err.Error(), "run walcount setup") {
		t.Fatalf("CheckVersion before migrating = %v, want ErrSchemaVersion naming walcount setup", err)
	}
	from, to, err := Migrate(ctx, db)
	if err != nil || from != 0 || to != Version {
		t.Fatalf("Migrate = %d, %d, %v; want 0, %d", from, to, err, Version)
	}
	if err := CheckVersion(ctx, db); err != nil {
		t.Fatalf("CheckVersion after migrating = %v", err)
	}
	w, err := ReadCheckpoint(ctx, db, "walcount")
	if err != nil || w.String() != "0/1A2B3C4D" {
		t.Fatalf("checkpoint after migrating = %s, %v; want 0/1A2B3C4D", w, err)
	}
	run, ok, err := NewRuns(db, "walcount").Unfinished(ctx)
	if err != nil || !ok || run.LastKey != "42" {
		t.Fatalf("unfinished run after migrating = %+v, %v, %v; want the running one at key 42", run, ok, err)
	}
	if from, to, err := Migrate(ctx, db); err != nil || from != Version || to != Version {
		t.Fatalf("second Migrate = %d, %d, %v; want a no-op at %d", from, to, err, Version)
	}
}

// TestSchemaVersions: no schema at all, a fresh schema, and a schema newer
// than this walcount, which neither check nor migrate accepts.
func TestSchemaVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if err := CheckVersion(ctx, db); !errors.Is(err, ErrNotSetUp) {
		t.Fatalf("CheckVersion without a schema = %v, want ErrNotSetUp", err)
	}
	if from, to, err := Migrate(ctx, db); err != nil || from != 0 || to != Version {
		t.Fatalf("Migrate on an empty database = %d, %d, %v", from, to, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO walcount.schema_version (version) VALUES ($1)`, Version+1); err != nil {
		t.Fatal(err)
	}
	err := CheckVersion(ctx, db)
	if !errors.Is(err, ErrSchemaVersion) || !strings.Contains(err.Error(), "newer than this walcount knows") {
		t.Fatalf("CheckVersion of a newer schema = %v", err)
	}
	if _, _, err := Migrate(ctx, db); !errors.Is(err, ErrSchemaVersion) {
		t.Fatalf("Migrate of a newer schema = %v, want ErrSchemaVersion", err)
	}
}

// TestCompareAndSet: the checkpoint moves only from W, so a replayed or
// concurrent flush applies nothing.
func TestCompareAndSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, _, err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCheckpoint(ctx, db, "s"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("ReadCheckpoint of a slot without one = %v, want ErrNoCheckpoint", err)
	}
	if w, err := InitCheckpoint(ctx, db, "s", 100, false); err != nil || w != 100 {
		t.Fatalf("InitCheckpoint = %s, %v", w, err)
	}
	if w, err := InitCheckpoint(ctx, db, "s", 50, false); err != nil || w != 100 {
		t.Fatalf("InitCheckpoint without replace = %s, %v; want the existing 0/64", w, err)
	}
	move := func(from, to LSN) bool {
		t.Helper()
		var moved bool
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var err error
			moved, err = CompareAndSet(ctx, tx, "s", from, to)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return moved
	}
	if !move(100, 200) {
		t.Fatal("CompareAndSet from W did not move it")
	}
	if move(100, 300) {
		t.Fatal("CompareAndSet from a stale W moved it")
	}
	w, age, err := ReadCheckpointAge(ctx, db, "s")
	if err != nil || w != 200 || age > time.Minute {
		t.Fatalf("ReadCheckpointAge = %s, %s, %v; want 0/C8 just now", w, age, err)
	}
}

func TestLeafChanges(t *testing.T) {
	a := Leaf{OID: 1, Name: "likes_a", FileNode: 10, Attached: "700"}
	b := Leaf{OID: 2, Name: "likes_b", FileNode: 20, Attached: "701"}
	c := Leaf{OID: 3, Name: "likes_c", FileNode: 30, Attached: "702", Preexisting: true}
	truncated := a
	truncated.FileNode = 11
	reattached := b
	reattached.Attached = "800"
	tests := []struct {
		name       string
		saved, now []Leaf
		changes    []string
		added      []Leaf
	}{
		{"same", []Leaf{a, b}, []Leaf{a, b}, nil, nil},
		{"dropped", []Leaf{a, b}, []Leaf{a}, []string{"partition likes_b detached or dropped"}, nil},
		{"truncated", []Leaf{a, b}, []Leaf{truncated, b}, []string{"partition likes_a truncated or rewritten"}, nil},
		{"attached again", []Leaf{a, b}, []Leaf{a, reattached}, []string{"partition likes_b detached and attached again"}, nil},
		{"added", []Leaf{a}, []Leaf{a, c}, nil, []Leaf{c}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changes, added := LeafChanges(tt.saved, tt.now)
			if !slices.Equal(changes, tt.changes) {
				t.Errorf("changes = %q, want %q", changes, tt.changes)
			}
			if !slices.Equal(added, tt.added) {
				t.Errorf("added = %+v, want %+v", added, tt.added)
			}
		})
	}
}

// TestUpdateCarried: a flush writes only the carried keys that changed;
// the others keep their row, and with it when they were first carried and
// when a parked one is tried again.
func TestUpdateCarried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, _, err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	if err := SaveCarried(ctx, db, "s", []Carried{
		{Counter: "c", Key: "1", Delta: 1, Since: long},
		{Counter: "c", Key: "2", Delta: 2, Since: long, Parked: "boom"},
		{Counter: "c", Key: "3", Delta: 3, Since: long},
	}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := SaveCarried(ctx, db, "other", []Carried{{Counter: "c", Key: "1", Delta: 7}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	was, err := LoadCarried(ctx, db, "s")
	if err != nil {
		t.Fatal(err)
	}
	var now []Carried
	for _, c := range was {
		switch c.Key {
		case "1": // unchanged
			now = append(now, c)
		case "2": // parked, not due, gets a delta
			c.Delta += 5
			now = append(now, c)
		}
		// 3 was applied
	}
	now = append(now, Carried{Counter: "c", Key: "4", Delta: -1})
	if err := UpdateCarried(ctx, db, "s", was, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := LoadCarried(ctx, db, "s")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b Carried) int { return strings.Compare(a.Key, b.Key) })
	if len(got) != 3 || got[0].Key != "1" || got[1].Key != "2" || got[2].Key != "4" {
		t.Fatalf("carried after the update = %+v", got)
	}
	if !got[0].Since.Equal(long) || !got[1].Since.Equal(long) || got[1].Delta != 7 || got[1].Parked != "boom" || got[1].Due {
		t.Errorf("kept keys lost their figures: %+v", got[:2])
	}
	if got[1].RetryAt == nil || time.Until(*got[1].RetryAt) < 50*time.Minute {
		t.Errorf("the parked key's retry time moved: %v", got[1].RetryAt)
	}
	if got[2].Delta != -1 || time.Since(got[2].Since) > time.Hour {
		t.Errorf("new key %+v", got[2])
	}
	if other, err := LoadCarried(ctx, db, "other"); err != nil || len(other) != 1 {
		t.Errorf("another slot's keys = %+v, %v", other, err)
	}
}

// TestCarriedPagesInKeyOrder: the pieces of a big batch read the carried
// keys in pages, integer keys in numeric order (neighbouring target rows),
// each once, by an index scan rather than a sort of the whole table.
func TestCarriedPagesInKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, _, err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO walcount.carried (slot_name, counter, key, delta)
SELECT 'pages', c, g::text, 1 FROM generate_series(1, 2500) g, unnest(ARRAY['a', 'b']) c`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `ANALYZE walcount.carried`); err != nil {
		t.Fatal(err)
	}
	var cur CarriedCursor
	var got []string
	for {
		page, next, err := LoadCarriedPage(ctx, db, "pages", cur, 700)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, c := range page {
			got = append(got, c.Counter+":"+c.Key)
		}
		cur = next
	}
	if len(got) != 5000 {
		t.Fatalf("read %d keys in pages, want 5000", len(got))
	}
	for i, k := range got {
		want := fmt.Sprintf("%s:%d", map[bool]string{true: "a", false: "b"}[i < 2500], i%2500+1)
		if k != want {
			t.Fatalf("key %d is %s, want %s", i, k, want)
		}
	}
	var plan string
	// The plan a prepared statement falls back to after a few runs.
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `PREPARE page(text, int, text, text) AS SELECT key FROM walcount.carried WHERE slot_name = $1
AND (counter, length(key), key) > ($3::text, length($4::text), $4::text) ORDER BY counter, length(key), key LIMIT $2`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE page('pages', 700, 'a', '700')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan += line + "\n"
	}
	if !strings.Contains(plan, "carried_drain_order") || strings.Contains(plan, "Sort") {
		t.Errorf("a page is not read by the index carried_drain_order:\n%s", plan)
	}
}
