package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFreshReadsSection is section 13 at the size of a test: a warm-up
// of half a second and three seconds measured. It checks what the
// section's figures rest on, not the figures: plain reads, min_lsn reads
// and receive probes all measured in the window, every answer a 200 at or
// past its min_lsn, the min_lsn reads seen by the daemon's wait histogram,
// and the counts exact at the end. How fast is the bench's business.
func TestFreshReadsSection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, Redis and walcount")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "walcount")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/walcount").CombinedOutput(); err != nil {
		t.Fatalf("build walcount: %v\n%s", err, out)
	}
	var log strings.Builder
	b := &bench{quick: true, bin: bin, tmp: dir, log: &log, freshWarmup: 500 * time.Millisecond, freshMeasure: 3 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := runFreshReads(ctx, b)
	t.Logf("progress:\n%s", log.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", freadsSection(r))
	// A busy machine may fall short of the target; a second's worth of
	// reads in three shows the pacing runs.
	if len(r.reads) < readsTarget {
		t.Errorf("%d plain reads in the window, want at least %d", len(r.reads), readsTarget)
	}
	if len(r.ryw) < 10 || len(r.recv) < 5 {
		t.Errorf("%d min_lsn reads and %d receive probes in the window, want at least 10 and 5", len(r.ryw), len(r.recv))
	}
	// The receive probe's likes are counted by change events
	// (runFreshReads waits for those of the window).
	if len(r.events) < 5 {
		t.Errorf("%d receive probes' likes timed to their change event in the window, want at least 5", len(r.events))
	}
	if r.errors != 0 {
		t.Errorf("%d reads failed or answered below their min_lsn", r.errors)
	}
	if r.waits == 0 || r.waitP99 != r.waitP99 {
		t.Errorf("walcount_fresh_read_wait_seconds saw %d waits in the window (p99 %v)", r.waits, r.waitP99)
	}
	if r.likes <= 0 || !r.exact {
		t.Errorf("likes/s %.0f, exact %v", r.likes, r.exact)
	}
}
