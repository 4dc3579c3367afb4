package deploy_test

import (
	"context"
	"net/url"
	"os"
	"slices"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// exporterQuery is one query of prometheus/postgres_exporter.yml, in
// postgres_exporter's format: each result column is a label or a metric.
type exporterQuery struct {
	Query   string                         `yaml:"query"`
	Metrics []map[string]map[string]string `yaml:"metrics"`
}

// exporterQueries parses prometheus/postgres_exporter.yml.
func exporterQueries(t *testing.T) map[string]exporterQuery {
	t.Helper()
	b, err := os.ReadFile("prometheus/postgres_exporter.yml")
	if err != nil {
		t.Fatal(err)
	}
	var qs map[string]exporterQuery
	if err := yaml.Unmarshal(b, &qs); err != nil {
		t.Fatalf("parse postgres_exporter.yml: %v", err)
	}
	if len(qs) == 0 {
		t.Fatal("postgres_exporter.yml has no query")
	}
	return qs
}

// exporterMetricNames returns the metrics postgres_exporter makes of the
// queries (<query>_<column> for every column that is not a label).
func exporterMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for q, def := range exporterQueries(t) {
		for _, m := range def.Metrics {
			for col, spec := range m {
				if spec["usage"] != "LABEL" {
					names[q+"_"+col] = true
				}
			}
		}
	}
	return names
}

// TestPostgresExporterQueries runs every query of postgres_exporter.yml on
// a real server, as a role that has only pg_monitor (as postgres_exporter
// runs), against an inactive pgoutput slot that WAL was written past: the
// result has exactly the declared columns, and the slot's row shows it
// inactive with the WAL it retains and its lag.
func TestPostgresExporterQueries(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{
		"CREATE ROLE exporter LOGIN IN ROLE pg_monitor",
		"SELECT pg_create_logical_replication_slot('walcount', 'pgoutput')",
		"CREATE TABLE filler AS SELECT g FROM generate_series(1, 10000) g",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	u, err := url.Parse(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("exporter")
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	for name, q := range exporterQueries(t) {
		var declared []string
		for _, m := range q.Metrics {
			for col := range m {
				declared = append(declared, col)
			}
		}
		rows, err := conn.Query(ctx, q.Query)
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		var got []string
		for _, f := range rows.FieldDescriptions() {
			got = append(got, f.Name)
		}
		var slots []map[string]any
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			row := map[string]any{}
			for i, v := range vals {
				row[got[i]] = v
			}
			slots = append(slots, row)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		sort.Strings(declared)
		sort.Strings(got)
		if !slices.Equal(declared, got) {
			t.Errorf("query %s returns columns %v, declares %v", name, got, declared)
		}
		if name != "pg_walcount_slot" {
			continue
		}
		i := slices.IndexFunc(slots, func(r map[string]any) bool { return r["slot_name"] == "walcount" })
		if i < 0 {
			t.Fatalf("query %s does not return slot walcount: %v", name, slots)
		}
		r := slots[i]
		if r["active"] != int32(0) || r["retained_wal_bytes"].(float64) <= 0 || r["lag_bytes"].(float64) <= 0 || r["database"] != "postgres" ||
			r["safe_wal_size_bytes"] != nil || r["unreserved"] != int32(0) || r["lost"] != int32(0) {
			t.Errorf("slot walcount read as %v: want inactive, in database postgres, with retained WAL and a lag, reserved, no safe_wal_size (unlimited)", r)
		}
	}
}
