package deploy_test

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/walcount/walcount/internal/metrics"
)

// metricName matches walcount metric names in a PromQL expression.
var metricName = regexp.MustCompile(`\bwalcount_[a-zA-Z0-9_]+`)

// exportedNames returns every series name walcount exports, including the
// _bucket, _sum and _count series of histograms.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.InitCounter("post_likes")
	// Series that exist only in a bad state still belong to the contract.
	m.SetSlotInvalidated(true, "wal_removed")
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[mf.GetName()+suffix] = true
			}
		}
	}
	return names
}

// checkExprs fails for an expression that names no walcount metric, or one
// that walcount does not export, and returns the names used.
func checkExprs(t *testing.T, exprs map[string]string) map[string]bool {
	t.Helper()
	exported := exportedNames(t)
	used := map[string]bool{}
	for where, expr := range exprs {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 && !strings.Contains(expr, "up{") {
			t.Errorf("%s: expression names no walcount metric: %s", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] {
				t.Errorf("%s: %s is not a metric walcount exports (expr %s)", where, n, expr)
			}
		}
	}
	return used
}

// postgresGroup is the group of alerts.yml whose rules read PostgreSQL's
// own view of the slot, from postgres_exporter, not walcount's metrics.
const postgresGroup = "walcount-postgres"

// exporterName matches the series names of postgres_exporter and
// node_exporter in a PromQL expression.
var exporterName = regexp.MustCompile(`\b(?:pg|node)_[a-zA-Z0-9_]+`)

// checkPostgresExprs fails for a rule of the postgres group that reads no
// series of postgres_exporter, or one that prometheus/postgres_exporter.yml
// does not make (node_exporter's node_filesystem_avail_bytes aside), or
// that reads walcount's metrics: these rules must work while no walcount
// runs, with any postgres_exporter that takes custom queries.
func checkPostgresExprs(t *testing.T, exprs map[string]string) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatalf("alerts.yml has no group %s", postgresGroup)
	}
	known := exporterMetricNames(t)
	known["node_filesystem_avail_bytes"] = true
	for where, expr := range exprs {
		if n := metricName.FindString(expr); n != "" {
			t.Errorf("%s reads walcount's %s: it must fire while no walcount runs", where, n)
		}
		names := exporterName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: expression reads no series of postgres_exporter: %s", where, expr)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("%s: %s is not made by postgres_exporter.yml", where, n)
			}
		}
	}
}

func TestAlertRulesUseExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("parse alerts.yml: %v", err)
	}
	exprs := map[string]string{}
	pgExprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if g.Name == postgresGroup {
				pgExprs["alert "+r.Alert] = r.Expr
				continue
			}
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	used := checkExprs(t, exprs)
	checkPostgresExprs(t, pgExprs)
	// A Redis outage shows only in these: flush errors count failed
	// PostgreSQL flushes.
	for _, n := range []string{"walcount_streaming", "walcount_session_failures_total", "walcount_waiting_for_slot"} {
		if !used[n] {
			t.Errorf("no alert watches %s", n)
		}
	}

	want := []string{
		"WalcountSlotInactive", "WalcountSlotLagHigh", "WalcountSlotWALUnreserved", "WalcountSlotInvalidated",
		"WalcountFlushErrors", "WalcountApplyLagHigh", "WalcountDown",
		"WalcountNotStreaming", "WalcountSessionFailures",
	}
	for _, a := range want {
		if _, ok := exprs["alert "+a]; !ok {
			t.Errorf("alerts.yml has no alert %s", a)
		}
	}
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/walcount.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string  `json:"uid"`
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/walcount.json is not valid JSON: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard needs a uid and a title, got uid=%q title=%q", dash.UID, dash.Title)
	}

	exprs := map[string]string{}
	ids := map[int]string{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if other, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs["panel "+p.Title+" "+tg.RefID] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	used := checkExprs(t, exprs)

	// The dashboard must show each of these.
	for _, n := range []string{
		"walcount_slot_lag_bytes", "walcount_slot_retained_wal_bytes", "walcount_slot_wal_status",
		"walcount_slot_active", "walcount_transactions_total", "walcount_changes_total",
		"walcount_flushes_total", "walcount_flush_duration_seconds_bucket",
		"walcount_apply_lag_seconds_bucket", "walcount_buffer_keys",
		"walcount_deltas_dropped_total", "walcount_reconcile_corrections_total",
		"walcount_streaming", "walcount_session_failures_total",
	} {
		if !used[n] {
			t.Errorf("no dashboard panel shows %s", n)
		}
	}
	if t.Failed() {
		t.Logf("metrics used: %v", slices.Sorted(maps.Keys(used)))
	}
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}
