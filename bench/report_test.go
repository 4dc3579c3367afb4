package main

import (
	"encoding/xml"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999.4: "999", 1000: "1,000", 1234567: "1,234,567", -4200: "-4,200", math.NaN(): "–"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestNiceScale(t *testing.T) {
	tests := []struct{ max, top, step float64 }{
		{6834, 8000, 2000},
		{950, 1000, 200},
		{12000, 12500, 2500},
		{0, 1, 1},
	}
	for _, tt := range tests {
		top, step := niceScale(tt.max)
		if top != tt.top || step != tt.step {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", tt.max, top, step, tt.top, tt.step)
		}
	}
}

func TestFreshRates(t *testing.T) {
	drain := []drainResult{{shape: drainShape{rowsPer: 1}, likes: 100_000, done: 5 * time.Second}} // 20k likes/s
	if got := freshRates(0, drain); len(got) != 2 || got[0] != 10_000 || got[1] != moderateRate {
		t.Errorf("freshRates = %v, want [10000 %d]", got, moderateRate)
	}
	if got := freshRates(0, nil); len(got) != 2 || got[0] != defaultFreshRate {
		t.Errorf("freshRates without a drain = %v", got)
	}
	if got := freshRates(1234, drain); len(got) != 1 || got[0] != 1234 {
		t.Errorf("freshRates(1234) = %v", got)
	}
}

func TestBucketBound(t *testing.T) {
	b := []bucket{{UpperBound: 0.5, Count: 50}, {UpperBound: 1, Count: 98}, {UpperBound: 2, Count: 100}, {UpperBound: math.Inf(1), Count: 100}}
	if got := bucketBound(0.99, b); got != 2 {
		t.Errorf("bucketBound(0.99) = %v, want 2", got)
	}
	if got := bucketBound(0.5, b); got != 0.5 {
		t.Errorf("bucketBound(0.5) = %v, want 0.5", got)
	}
}

func TestProcUsageOfSelf(t *testing.T) {
	u, err := procUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.peakRSS <= 0 {
		t.Errorf("peak RSS %d, want > 0", u.peakRSS)
	}
}

// fakeResults has every section, so that rendering is exercised.
func fakeResults() *results {
	lat := []time.Duration{time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond}
	w := &writeResults{}
	for _, wl := range workloads {
		for _, n := range []int{1, 8, 32} {
			for i, cfg := range appConfigs {
				w.cells = append(w.cells, writeCell{config: cfg.key, workload: wl.name, clients: n,
					res: runResult{txns: int64(1000 * n / (i + 1)), elapsed: time.Second, latencies: lat}})
			}
		}
		for _, cfg := range appConfigs {
			w.totals = append(w.totals, writeTotals{config: cfg.key, workload: wl.name, likes: 100_000, updates: 100_000, exact: cfg.counts,
				cost: usage{cpu: time.Second, peakRSS: 30 << 20}, sender: 2 * time.Second})
		}
	}
	return &results{
		started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), elapsed: time.Minute, rev: "abc1234", busy: "calm",
		machine: machine{cpus: 2, postgres: "PostgreSQL 15.20"},
		write:   w,
		drain: []drainResult{{shape: drainShapes[0], likes: 1000, walBytes: 1 << 20, bare: bareResult{elapsed: time.Second, sender: time.Second},
			received: time.Second, done: 2 * time.Second, cost: usage{cpu: time.Second}, txns: 1, scripts: 3}},
		fresh: []freshResult{{target: 1000, achieved: 990, lagP50: 0.5, lagP99: 1.1, lagBucketP99: 2, probes: lat, likes: 5000, total: 6000,
			updates: 2000, flushes: 10, deltas: 2000, cpu: time.Second, exact: true}},
	}
}

func TestMarkdownHasEverySection(t *testing.T) {
	md := fakeResults().markdown()
	for _, want := range []string{"## 1. App write path", "## 2. Drain", "## 3. Freshness", "## 4. Write amplification",
		"## 5. Daemon cost", "## 6. What reading the slot costs", "(e) pg_recvlogical on the same slot", "## Targets", "walcount abc1234", "| hot post | 32 | 32,000 | 16,000 (0.50×) |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	d := xml.NewDecoder(strings.NewReader(fakeResults().svg()))
	bars := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("svg does not parse: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			bars++
		}
	}
	// Background, a legend swatch per configuration, 2 workloads × 3
	// client counts × the configurations.
	if want := 1 + len(appConfigs) + 2*3*len(appConfigs); bars != want {
		t.Errorf("%d rects, want %d", bars, want)
	}
}

func TestResultNames(t *testing.T) {
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		r    results
		want string
	}{
		{results{}, "latest"},
		{results{quick: true}, "latest-quick"},
		{results{only: "reconcile"}, "latest-reconcile"},
		{results{only: "drain+reconcile", quick: true}, "latest-drain+reconcile-quick"},
	} {
		tc.r.started = day
		if got := tc.r.latestName(); got != tc.want {
			t.Errorf("latestName of %+v = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestReconcileReport(t *testing.T) {
	r := &results{reconcile: &reconcileResult{
		posts: 1_000_000, likes: 5_000_000, injected: 1000, truth: time.Second, limit: reconcileLimitedRate,
		pass:      passResult{elapsed: 1800 * time.Millisecond, checked: 1_000_001, drifted: 1000, corrected: 1000},
		backfill:  passResult{elapsed: 16 * time.Second, checked: 1_000_001, corrected: 993_000},
		writeIdle: loopResult{likes: 30_000, elapsed: 3 * time.Second},
		writeFull: loopResult{likes: 20_000, elapsed: 2 * time.Second},
	}}
	var b strings.Builder
	r.reconcileSection(&b)
	r.targetsSection(&b)
	md := b.String()
	for _, want := range []string{
		"| 1.00 s | 1.80 s | 1.80× | 1,000,001 | 555,556 | 1.80 s | 1,000 / 1,000 / 1,000 |",
		"993,000 of them off and corrected",
		"| full-speed pass | 10,000 | 1.00× |",
		"full reconciliation pass ≤ 3 × one truth computation: met (1.80×",
		"the pass found exactly the injected drift: met",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	r.reconcile.pass.drifted = 999
	r.reconcileErr = errDriftMismatch
	b.Reset()
	r.reconcileSection(&b)
	r.targetsSection(&b)
	if md := b.String(); !strings.Contains(md, "**FAILED**") || !strings.Contains(md, "the pass found exactly the injected drift: NOT met") {
		t.Errorf("a failed section does not say so:\n%s", md)
	}
}
