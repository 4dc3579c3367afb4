// Command bench measures walcount side by side with the alternatives on
// this machine, in one run, and writes a Markdown table and an SVG chart.
//
// It is `make bench` (`go run ./bench`; -quick for `make bench QUICK=1`).
// See docs/benchmarks.md for what each section measures and how.
//
//  1. App write path: likes/s and latency of clients inserting likes, with
//     no slot (a), with walcount running (b), in the counter_cache style
//     (c) and with an AFTER INSERT trigger (d); one hot post and Zipf over
//     10k posts; 1, 8 and 32 clients.
//  2. Drain: a backlog built while walcount is stopped; time until W
//     passes its end, against a bare pglogrepl reader on a second slot.
//  3. Freshness: walcount_apply_lag_seconds at half the drain ceiling,
//     and a probe that times commit → likes_count visible.
//  4. Write amplification: UPDATEs on posts per 100k likes.
//  5. Daemon cost: walcount's CPU seconds and peak RSS per million likes.
//  8. The app's side: latency of the app's own single-row updates of the
//     target rows, and the deadlocks returned to an app updating two hot
//     posts, without and with walcount, while one row is held by a long
//     transaction.
//  9. One big batch: one statement likes 100k, 1M and 2M posts; time until
//     exact, walcount's and Redis's peak memory, the longest wait of a
//     PING and of an app's row lock, and a SIGKILL in the middle.
//  13. Fresh reads: read latency at 1,000 reads/s while 16 clients like
//     one post, the min_lsn wait against the stream's receive lag.
//  14. The first storm after a backfill: an app's schema cut over from
//     its triggers under load, then storms of votes and comments; apply
//     lag, staged batches and CPU per storm.
//
// Every cluster is fresh (a slot changes the write path) and lives on
// disk, with fsync on and synchronous_commit=on.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// bench is one run's settings.
type bench struct {
	quick      bool
	bigSizes   []int64 // section 11's sizes when given (-big-sizes)
	bin        string
	tmp        string // walcount logs
	standbyDir string // section 9's clusters (-standby-data-dir)
	// standbyWarmup and standbyMeasure override section 9's durations
	// (its test runs it in seconds).
	standbyWarmup, standbyMeasure time.Duration
	outDir                        string
	profileDir                    string
	clientCounts                  []int
	rounds                        int           // rounds per client count in section 1
	warmup                        time.Duration // per round
	measure                       time.Duration // per round
	backlog                       int64         // likes per drain backlog
	freshWarmup                   time.Duration
	freshMeasure                  time.Duration
	freshRate                     float64
	// reconcilePosts overrides the reconcile section's table size;
	// reconcileBatch its passes' batch size (0: the daemon's default).
	reconcilePosts int64
	reconcileBatch int
	// reconcileWalcountFlags are added to the section's walcount run.
	reconcileWalcountFlags []string
	// reconcileWrite measures the write path during passes.
	reconcileWrite bool
	// reconcileConfig is a walcount config file for the reconcile
	// section's daemon (its settings; its counters must be the default).
	reconcileConfig string
	soak            soakSettings
	// stormSize overrides section 14's data and load; stormRate and
	// stormRound its storms' rate and length (-storm-rate, -storm-round).
	stormSize  *stormSize
	stormRate  float64
	stormRound time.Duration
	log        io.Writer
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, format+"\n", args...)
}

// Sizes of a full and a quick run.
const (
	// As many rounds as section 1 has configurations: the order rotates
	// by one each round, so every configuration runs once in every
	// position, and a disturbance tied to a position (the autovacuum
	// that (c) and (d) leave behind on their clusters, say) falls on all
	// of them alike.
	fullRounds       = 5
	fullWarmup       = 400 * time.Millisecond
	fullMeasure      = 1200 * time.Millisecond
	fullBacklog      = 1_000_000
	fullFreshWarmup  = 5 * time.Second
	fullFreshMeasure = 20 * time.Second

	quickRounds       = 1
	quickWarmup       = 300 * time.Millisecond
	quickMeasure      = time.Second
	quickBacklog      = 100_000
	quickFreshWarmup  = 2 * time.Second
	quickFreshMeasure = 4 * time.Second

	// defaultFreshRate is the freshness rate when the drain did not run.
	defaultFreshRate = 2000
	// moderateRate is the second freshness rate: a steady load that a
	// small machine carries next to its app, where half the drain ceiling
	// may saturate it.
	moderateRate = 1000
)

// freshRates returns the freshness runs' rates: the one asked for, else
// half of walcount's drain rate for single-row transactions and, when that
// is much higher, moderateRate too.
func freshRates(asked float64, drain []drainResult) []float64 {
	if asked > 0 {
		return []float64{asked}
	}
	half := float64(defaultFreshRate)
	for _, d := range drain {
		if d.shape.rowsPer == 1 {
			half = d.rate() / 2
		}
	}
	if half > 1.5*moderateRate {
		return []float64{half, moderateRate}
	}
	return []float64{half}
}

func main() {
	os.Exit(run())
}

// benchFlags are the flags that are not settings of a bench.
type benchFlags struct {
	only, dataDir, rev string
	keepLogs           bool
	soakSummary        string // -soak-summary: summarize this soak CSV
}

// allSections are the sections, in the order they run.
var allSections = []string{"write", "drain", "fresh", "reconcile", "app", "standby", "binary", "big", "multi", "reads", "storm"}

func run() int {
	b, fl := parseFlags()
	sections, err := parseSections(fl.only)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 2
	}
	if _, err := os.Stat(b.bin); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v (run make build first)\n", err)
		return 2
	}
	// Clusters on disk: commits pay for fsync as in production. The
	// servers package prefers a tmpfs otherwise.
	if os.Getenv(servers.EnvTempDir) == "" {
		os.Setenv(servers.EnvTempDir, fl.dataDir)
	}
	tmp, err := os.MkdirTemp("", "walcount-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if fl.keepLogs {
		defer fmt.Fprintf(os.Stderr, "bench: walcount's logs are in %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	b.tmp = tmp
	if b.profileDir != "" {
		if err := os.MkdirAll(b.profileDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &results{started: time.Now(), quick: b.quick, machine: describeMachine(fl.dataDir), rev: fl.rev}
	if fl.only != "" {
		var names []string
		for _, s := range allSections {
			if sections[s] {
				names = append(names, s)
			}
		}
		if len(names) < len(allSections) {
			r.only = strings.Join(names, "+")
		}
	}
	if b.soak.duration > 0 || fl.soakSummary != "" {
		return runSoakCommand(ctx, b, fl.soakSummary)
	}
	busy := startBusyMeter()
	b.logf("walcount bench (%s) on %s", r.mode(), r.machine.summary())
	if err := runSections(ctx, b, r, sections); err != nil {
		return fail(err)
	}
	r.elapsed = time.Since(r.started)
	r.busy = busy.String()

	md := r.markdown()
	fmt.Print(md)
	if b.profileDir != "" {
		b.logf("profile mode: results not written to %s", b.outDir)
		return 0
	}
	if r.reconcileErr != nil {
		// A pass that did not find exactly the injected drift fails the
		// bench loudly, and its figures are not saved as the latest.
		return fail(r.reconcileErr)
	}
	if err := r.save(b.outDir); err != nil {
		return fail(err)
	}
	b.logf("wrote %s", filepath.Join(b.outDir, r.latestName()+".md"))
	return 0
}

// parseFlags reads the command line into a bench, with the sizes of a
// full or a quick run.
func parseFlags() (*bench, benchFlags) {
	b := &bench{log: os.Stderr, clientCounts: []int{1, 8, 32}}
	fl := benchFlags{rev: gitRevision()}
	flag.BoolVar(&b.quick, "quick", false, "a short run (about a minute): shorter steps, a 100k backlog")
	flag.StringVar(&b.bin, "bin", "bin/walcount", "the walcount binary (make build)")
	flag.StringVar(&b.outDir, "out", "bench/results", "where the results go")
	flag.Func("big-sizes", "comma-separated batch sizes of the big section (default 100000,1000000,2000000; 100000 with -quick); the last also runs with a SIGKILL", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("bad size %q", f)
			}
			b.bigSizes = append(b.bigSizes, n)
		}
		return nil
	})
	flag.StringVar(&fl.only, "only", "", "comma-separated sections to run: write, drain, fresh, reconcile, app, standby, binary, big, multi, reads, storm (default all)")
	flag.Int64Var(&b.reconcilePosts, "reconcile-posts", 0, "posts of the reconcile section, 5 likes each (default 1M, 100k with -quick)")
	flag.IntVar(&b.reconcileBatch, "reconcile-batch", 0, "keys per measurement of the reconcile section's passes (default the daemon's)")
	flag.StringVar(&b.profileDir, "profile", "", "run the drain's daemon in this process under the CPU profiler and write drain-*.pprof here (no cost figures)")
	flag.Float64Var(&b.freshRate, "fresh-rate", 0, "likes/s of the freshness run (default half the 1-row drain rate)")
	flag.StringVar(&fl.dataDir, "data-dir", os.TempDir(), "directory for the clusters (on the disk being measured)")
	flag.StringVar(&b.standbyDir, "standby-data-dir", "/dev/shm", "directory for the standby section's clusters: memory, so that the pinned primary is bound by its CPU, not by its disk's flushes (empty: -data-dir)")
	flag.StringVar(&fl.rev, "rev", fl.rev, "the walcount revision measured, for the report (default: this checkout's commit)")
	flag.BoolVar(&b.reconcileWrite, "reconcile-write", true, "measure the app's write path during passes in the reconcile section")
	var reconcileDebug bool
	flag.BoolVar(&reconcileDebug, "reconcile-debug", false, "run the reconcile section's walcount at debug level and keep its log")
	flag.BoolVar(&fl.keepLogs, "keep-logs", false, "keep every walcount's log (and a GODEBUG given to the bench is walcount's too) in a directory the bench names at its end")
	flag.StringVar(&b.reconcileConfig, "reconcile-config", "", "a walcount config file for the reconcile section's daemon (settings such as flush_interval; the counters must be the default)")
	flag.DurationVar(&b.soak.duration, "soak", 0, "run the soak for this long instead of the sections (make soak: 1h)")
	flag.DurationVar(&b.soak.faultEvery, "soak-fault-every", 3*time.Minute, "the soak's period: load, a fault, load, a quiet point")
	flag.DurationVar(&b.soak.sampleEvery, "soak-sample-every", 10*time.Second, "how often the soak samples its resources")
	flag.DurationVar(&b.soak.settleLimit, "soak-settle", 5*time.Minute, "how long a quiet point waits for walcount to apply everything")
	flag.DurationVar(&b.soak.lockHold, "soak-lock-hold", time.Minute, "how long the soak's row-lock fault holds its rows")
	flag.Int64Var(&b.soak.bulk, "soak-bulk", 2_000_000, "rows of the soak's bulk insert fault")
	flag.IntVar(&b.soak.clients, "soak-clients", 4, "the soak's churning clients (besides the one that deletes and re-creates posts)")
	flag.StringVar(&b.soak.out, "soak-out", "bench/results", "where the soak writes soak-<time>.csv and .md")
	flag.Func("soak-faults", "comma-separated faults of the soak's rotation (default all: "+strings.Join(soakFaults, ", ")+"; failover on PostgreSQL 17 and later only)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if !slices.Contains(soakFaults, f) {
				return fmt.Errorf("unknown fault %q", f)
			}
			b.soak.faults = append(b.soak.faults, f)
		}
		return nil
	})
	flag.Float64Var(&b.stormRate, "storm-rate", 0, "transactions/s of the storm section's storms (default 800, 400 with -quick)")
	flag.DurationVar(&b.stormRound, "storm-round", 0, "length of each of the storm section's storms (default 45s, 10s with -quick)")
	flag.StringVar(&fl.soakSummary, "soak-summary", "", "summarize a soak CSV (one still being written too) and exit")
	flag.Parse()
	if reconcileDebug {
		b.reconcileWalcountFlags = []string{"--log-level", "debug"}
	}

	b.rounds, b.warmup, b.measure, b.backlog = fullRounds, fullWarmup, fullMeasure, fullBacklog
	b.freshWarmup, b.freshMeasure = fullFreshWarmup, fullFreshMeasure
	if b.quick {
		b.rounds, b.warmup, b.measure, b.backlog = quickRounds, quickWarmup, quickMeasure, quickBacklog
		b.freshWarmup, b.freshMeasure = quickFreshWarmup, quickFreshMeasure
	}
	return b, fl
}

// parseSections returns the sections -only names, or all of them. The
// standby section (9) says it was skipped below PostgreSQL 16
// (WALCOUNT_TEST_PG selects the server).
func parseSections(only string) (map[string]bool, error) {
	sections := map[string]bool{}
	if only == "" {
		for _, s := range allSections {
			sections[s] = true
		}
		return sections, nil
	}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSections, s) {
			return nil, fmt.Errorf("unknown section %q (want write, drain, fresh, reconcile, app, standby, binary, big, multi, reads or storm)", s)
		}
		sections[s] = true
	}
	return sections, nil
}

// runSections runs the sections asked for, in their order, into r. A
// failed reconcile section goes into r (the report says why), the others
// end the run.
func runSections(ctx context.Context, b *bench, r *results, sections map[string]bool) error {
	var err error
	if sections["write"] {
		b.logf("1. app write path")
		if r.write, err = runWritePath(ctx, b); err != nil {
			return err
		}
	}
	if sections["drain"] {
		b.logf("2. drain of a %d-like backlog", b.backlog)
		if r.drain, err = runDrain(ctx, b); err != nil {
			return err
		}
	}
	if sections["fresh"] {
		rates := freshRates(b.freshRate, r.drain)
		if b.quick {
			rates = rates[:1] // the moderate rate only in full runs
		}
		for _, rate := range rates {
			b.logf("3. freshness at %.0f likes/s", rate)
			fr, err := runFreshness(ctx, b, rate)
			if err != nil {
				return err
			}
			r.fresh = append(r.fresh, fr)
		}
	}
	if sections["reconcile"] {
		b.logf("7. reconciliation of a large table")
		started := time.Now()
		rr, err := runReconcile(ctx, b)
		r.reconcile = rr
		if rr != nil {
			rr.took = time.Since(started)
		}
		if err != nil {
			// The figures so far go into the report, which says why
			// the section failed; the run fails.
			r.reconcileErr = err
		}
	}
	if sections["app"] {
		b.logf("8. the app's side, one row held")
		if r.app, err = runAppSide(ctx, b); err != nil {
			return err
		}
	}
	if sections["standby"] {
		b.logf("9. decoding on a standby, the primary pinned")
		if r.standby, err = runStandbyBench(ctx, b); err != nil {
			return err
		}
	}
	if sections["binary"] {
		b.logf("10. pgoutput text or binary")
		md, err := runBinaryBench(ctx, b)
		if err != nil {
			return err
		}
		r.standby += md
	}
	if sections["big"] {
		b.logf("11. one big batch")
		if r.big, err = runBig(ctx, b); err != nil {
			return err
		}
	}
	if sections["multi"] {
		b.logf("12. a multi-level counter")
		if r.multi, err = runMultiLevel(ctx, b); err != nil {
			return err
		}
	}
	if sections["reads"] {
		b.logf("13. fresh reads")
		fr, err := runFreshReads(ctx, b)
		if err != nil {
			return err
		}
		r.reads = freadsSection(fr)
	}
	if sections["storm"] {
		b.logf("14. the first storm after a backfill")
		sr, err := runStorm(ctx, b)
		if sr != nil && len(sr.rounds) > 0 {
			r.storm = stormSection(sr)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// gitRevision returns the checkout's commit, with "+dirty" when tracked
// files differ from it, or "" outside a git checkout.
func gitRevision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		rev += "+dirty"
	}
	return rev
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "bench:", err)
	return 1
}
