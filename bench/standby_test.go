package main

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// TestStandbySection is section 9 at the size of a test: one round of
// the three arms, a second of each, on the PostgreSQL that
// WALCOUNT_TEST_PG selects (16 or later; .ci/run runs it on 17). It
// checks what the section's figures rest on, not the figures: each
// process pinned where the section says (pinTree reads the pin back), every walcount arm
// exact (the arm verifies each post against COUNT(*)), and a walsender
// and walcount that each spent CPU on the changes counted. How fast
// is the bench's business (make bench), not a test's.
func TestStandbySection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a standby and walcount")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("needs taskset")
	}
	if os.Getenv("WALCOUNT_TEST_PG") == "" {
		t.Skip("set WALCOUNT_TEST_PG to 16 or later (decoding on a standby)")
	}
	dir, bin := buildWalcount(t)
	if os.Getenv(servers.EnvTempDir) == "" {
		t.Setenv(servers.EnvTempDir, dir)
	}
	var log strings.Builder
	b := &bench{quick: true, bin: bin, tmp: dir, standbyDir: "/dev/shm", log: &log,
		standbyWarmup: 300 * time.Millisecond, standbyMeasure: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := runStandbyBench(ctx, b)
	t.Logf("progress:\n%s", log.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out)
	if strings.Contains(out, "Skipped") {
		t.Skip(strings.TrimSpace(out))
	}
	for _, arm := range []string{"insert-only", "walcount decoding on the primary", "walcount decoding on the standby", "control"} {
		row := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(arm) + `[^|]*\|(.*)$`).FindStringSubmatch(out)
		if row == nil {
			t.Fatalf("no row for %q", arm)
		}
		cells := strings.Split(row[1], "|")
		if len(cells) < 8 {
			t.Fatalf("row %q: %d cells", arm, len(cells))
		}
		if tps, err := strconv.ParseFloat(strings.TrimSpace(cells[2]), 64); err != nil || tps <= 0 {
			t.Errorf("%s: txn/s %q", arm, cells[2])
		}
		if arm == "insert-only" || arm == "control" {
			continue
		}
		// Redis's CPU over a second of this arm is a tick or none (its
		// clock counts 10 ms): read, not required positive.
		for i, what := range []string{"walsender", "walcount", "Redis", "walcount's sessions on the primary"} {
			v, err := strconv.ParseFloat(strings.TrimSpace(cells[3+i]), 64)
			if err != nil || v < 0 || (v == 0 && (what == "walsender" || what == "walcount")) {
				t.Errorf("%s: %s µs/change %q, want a figure (positive for the walsender and walcount)", arm, what, cells[3+i])
			}
		}
	}
}
