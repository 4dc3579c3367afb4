package main

import (
	"context"
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
	dir, bin := buildWalcount(t)
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
	// How many fit in the window is the machine's business (a loaded
	// one made 199 plain reads of the 1,000 asked, and 7 min_lsn reads):
	// the figures need samples of each kind, not a rate.
	if len(r.reads) == 0 || len(r.ryw) == 0 || len(r.recv) == 0 {
		t.Errorf("%d plain reads, %d min_lsn reads and %d receive probes in the window: the section measured nothing of some kind",
			len(r.reads), len(r.ryw), len(r.recv))
	}
	// The receive probe's likes are counted by change events
	// (runFreshReads waits for those of the window).
	if len(r.events) == 0 {
		t.Errorf("no receive probe's like timed to its change event in the window")
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
