package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/operator"
)

// ShippedSchemas are the state schema versions older walcounts made, each
// kept as testdata/schema_vN.sql (version 0: before the schema had one).
var shippedSchemas = func() []int {
	var out []int
	for v := 0; v < Version; v++ {
		out = append(out, v)
	}
	return out
}()

// loadShipped makes the state schema of version v in db, from testdata.
func loadShipped(t *testing.T, db *pgxpool.Pool, v int) {
	t.Helper()
	ddl, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("schema_v%d.sql", v)))
	if err != nil {
		t.Fatalf("version %d has no testdata: every state schema a walcount shipped is kept there: %v", v, err)
	}
	if _, err := db.Exec(context.Background(), string(ddl)); err != nil {
		t.Fatalf("schema_v%d.sql: %v", v, err)
	}
}

// schemaShape describes walcount's schema as the catalogs hold it: every
// column with its type, nullability and default, every index and
// constraint, every grant to PUBLIC.
func schemaShape(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	var shape string
	err := db.QueryRow(context.Background(), `
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
  SELECT format('column %s.%s %s %s %s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
                CASE WHEN a.attnotnull THEN 'not null' ELSE 'null' END, pg_get_expr(d.adbin, d.adrelid)) AS line
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
  WHERE n.nspname = 'walcount' AND c.relkind = 'r'
  UNION ALL
  SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'walcount'
  UNION ALL
  SELECT format('constraint %s %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
  WHERE connamespace = 'walcount'::regnamespace
  UNION ALL
  SELECT format('public %s %s', table_name, privilege_type) FROM information_schema.role_table_grants
  WHERE table_schema = 'walcount' AND grantee = 'PUBLIC'
) lines`).Scan(&shape)
	if err != nil {
		t.Fatal(err)
	}
	return shape
}

// TestMigrateFromEveryShippedSchema starts from the state schema of every
// version a walcount shipped, with a checkpoint, a reconciliation run in
// progress and, where the version has them, column claims and carried
// deltas, and migrates it: the result is the schema a new setup makes,
// column for column, and every row is kept. Migrating again changes
// nothing, and two migrations at once (two daemons, or a daemon and a
// setup) wait for each other: one migrates, the other finds it done.
func TestMigrateFromEveryShippedSchema(t *testing.T) {
	t.Parallel()
	fresh := pool(t)
	if _, _, err := Migrate(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	want := schemaShape(t, fresh)
	for _, v := range shippedSchemas {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pool(t)
			loadShipped(t, db, v)
			if got, err := ReadVersion(ctx, db); err != nil || got != v {
				t.Fatalf("ReadVersion of schema_v%d.sql = %d, %v", v, got, err)
			}
			rows := []string{
				`INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at) VALUES ('walcount', '0/1A2B3C4D', now())`,
				`INSERT INTO walcount.reconcile_runs (slot_name, kind, counters, dry_run, batch_size, status, last_key)
				 VALUES ('walcount', 'full', '{post_likes}', false, 1000, 'running', '42')`,
			}
			if v >= 2 {
				rows = append(rows, `INSERT INTO walcount.owners (target_table, target_column, slot_name, counter) VALUES ('public.posts', 'likes_count', 'walcount', 'post_likes')`)
			}
			if v >= 4 {
				rows = append(rows, `INSERT INTO walcount.carried (slot_name, counter, key, delta) VALUES ('walcount', 'post_likes', '7', 3), ('walcount', 'post_likes', '12', -2)`)
			}
			for _, q := range rows {
				if _, err := db.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}

			// Two at once: the advisory lock serialises them.
			var wg sync.WaitGroup
			froms := make([]int, 2)
			errs := make([]error, 2)
			for i := range 2 {
				wg.Go(func() { froms[i], _, errs[i] = Migrate(ctx, db) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("Migrate from version %d: %v", v, err)
			}
			if min(froms[0], froms[1]) != v || max(froms[0], froms[1]) != Version {
				t.Errorf("two Migrates at once went from versions %v, want one from %d and one finding %d", froms, v, Version)
			}
			if err := CheckVersion(ctx, db); err != nil {
				t.Fatal(err)
			}
			if got := schemaShape(t, db); got != want {
				t.Errorf("the schema migrated from version %d differs from a new one:\n%s", v, diffLines(got, want))
			}
			if w, err := ReadCheckpoint(ctx, db, "walcount"); err != nil || w.String() != "0/1A2B3C4D" {
				t.Errorf("checkpoint after migrating = %s, %v; want 0/1A2B3C4D", w, err)
			}
			if run, ok, err := NewRuns(db, "walcount").Unfinished(ctx); err != nil || !ok || run.LastKey != "42" {
				t.Errorf("unfinished run after migrating = %+v, %v, %v; want the running one at key 42", run, ok, err)
			}
			if v >= 4 {
				carried, err := LoadCarried(ctx, db, "walcount")
				if err != nil || len(carried) != 2 {
					t.Errorf("carried after migrating = %+v, %v; want the 2 carried deltas", carried, err)
				}
			}
			if v >= 2 {
				if owner, err := ownerOf(ctx, db); err != nil || owner != "walcount" {
					t.Errorf("owner of posts.likes_count after migrating = %q, %v", owner, err)
				}
			}
			if from, to, err := Migrate(ctx, db); err != nil || from != Version || to != Version {
				t.Errorf("Migrate again = %d, %d, %v; want a no-op", from, to, err)
			}
		})
	}
}

func ownerOf(ctx context.Context, db *pgxpool.Pool) (string, error) {
	var s string
	err := db.QueryRow(ctx, `SELECT slot_name FROM walcount.owners WHERE target_table = 'public.posts' AND target_column = 'likes_count'`).Scan(&s)
	return s, err
}

// diffLines lists the lines of got and want that the other lacks.
func diffLines(got, want string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	g, w := in(got), in(want)
	var b strings.Builder
	for l := range g {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	for l := range w {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	return b.String()
}

// TestNewerSchemaIsClassified: the state of a newer walcount is an error
// of class NewerState (exit 2), which still wraps ErrSchemaVersion.
func TestNewerSchemaIsClassified(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pool(t)
	if _, _, err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO walcount.schema_version (version) VALUES ($1)`, Version+1); err != nil {
		t.Fatal(err)
	}
	err := CheckVersion(ctx, db)
	want := fmt.Sprintf("version %d, newer than this walcount knows (%d)", Version+1, Version)
	if !errors.Is(err, ErrSchemaVersion) || operator.ClassOf(err) != operator.NewerState || !operator.Needed(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("CheckVersion of a newer schema = %v (class %v), want ErrSchemaVersion of class newer state saying %q", err, operator.ClassOf(err), want)
	}
	if _, _, err := Migrate(ctx, db); operator.ClassOf(err) != operator.NewerState {
		t.Errorf("Migrate of a newer schema = %v (class %v), want class newer state", err, operator.ClassOf(err))
	}
}
