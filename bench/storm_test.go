package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestStormSection is section 14 at the size of a test: a thousand posts,
// storms of two seconds. It checks what the section's figures rest on,
// not the figures: the backfill checked keys, every round wrote
// transactions that walcount flushed and the probe saw, the staged
// batches are read from the log, and every column is exact at the end.
// How fast is the bench's business.
func TestStormSection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, Redis and walcount")
	}
	dir, bin := buildWalcount(t)
	var log strings.Builder
	b := &bench{quick: true, bin: bin, tmp: dir, log: &log,
		stormSize: &stormSize{posts: 1_000, users: 100, votes: 5_000, comments: 2_000, rate: 200, round: 2 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := runStorm(ctx, b)
	t.Logf("progress:\n%s", log.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", stormSection(r))
	if !r.exact {
		t.Error("not exact after the rounds")
	}
	// Every key of the thirteen counters' targets and via tables: posts
	// (five counters, two via tables), users (four) and the site row
	// (four), at the least.
	if want := int64(1_001*5 + 100*4); r.backfillKeys < want {
		t.Errorf("the backfill checked %d keys, want at least %d", r.backfillKeys, want)
	}
	if r.lightTxns <= 0 {
		t.Errorf("the light load wrote %d transactions during the cutover", r.lightTxns)
	}
	if len(r.rounds) != stormRounds {
		t.Fatalf("%d rounds, want %d", len(r.rounds), stormRounds)
	}
	for i, rd := range r.rounds {
		if rd.txns <= 0 || rd.flushes <= 0 || len(rd.probes) == 0 || rd.cpu <= 0 {
			t.Errorf("round %d: %d transactions, %.0f flushes, %d probes, CPU %s; want each positive", i+1, rd.txns, rd.flushes, len(rd.probes), rd.cpu)
		}
		if rd.lagP99 != rd.lagP99 {
			t.Errorf("round %d: no apply lag observed", i+1)
		}
	}
}
