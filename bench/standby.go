package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
)

// Section 9: the primary's side of decoding on a standby. The primary
// (postmaster and every process it forks) and the load generator are
// pinned to CPU 0; its hot standby, Redis and walcount to CPU 1
// (taskset), so that the primary's cost is seen apart from the rest. Four
// arms on one pair of clusters, the standby running in all of them:
// insert-only (no slot, no walcount), walcount decoding on the primary,
// walcount decoding on the standby (replication_url), and the control,
// insert-only with CPU 1 kept busy by a spin loop. Each arm is the
// hot-post write path (standbyClients clients, one INSERT per transaction
// on post 1); a walcount arm then drains and reports the CPU of the
// walsender, walcount, Redis and walcount's sessions on the primary per
// counted change.

const standbyClients = 8

// standbyArm is what one arm measured.
type standbyArm struct {
	name                 string
	tps                  float64
	changes              int64
	sender, wc, redisCPU time.Duration
	// onPrimary is the CPU of walcount's SQL sessions on the primary
	// (flushes, heartbeats, markers, status), its walsender apart.
	onPrimary time.Duration
}

func (a standbyArm) perChange(d time.Duration) string {
	if a.changes == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", float64(d.Microseconds())/float64(a.changes))
}

// pinTree pins the process pid and all its descendants (threads
// included) to cpus; children forked later inherit it.
func pinTree(pid int, cpus string) error {
	pids := []int{pid}
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			children[pp] = append(children[pp], p)
		}
	}
	for i := 0; i < len(pids); i++ {
		pids = append(pids, children[pids[i]]...)
	}
	for _, p := range pids {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(p)).CombinedOutput(); err != nil {
			return fmt.Errorf("taskset %d: %v: %s", p, err, out)
		}
	}
	// The pin must hold: the section's figures mean nothing otherwise.
	if got, err := cpusAllowed(pid); err != nil || got != cpus {
		return fmt.Errorf("pin %d to CPU %s: it may run on %q (%v)", pid, cpus, got, err)
	}
	return nil
}

// cpusAllowed returns the CPUs process pid may run on, as
// /proc/pid/status lists them ("0", "0-1").
func cpusAllowed(pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no Cpus_allowed_list")
}

// pinSelf pins every thread of this process to cpus; threads made later
// inherit it from the thread that makes them.
func pinSelf(cpus string) error {
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset self: %v: %s", err, out)
	}
	return nil
}

// standbyRun is section 9 under way: the pair of clusters, the pins and
// the arms' durations.
type standbyRun struct {
	b       *bench
	c       *cluster
	standby *servers.Postgres
	sb      *pgxpool.Pool // the standby
	// dataDir says where the clusters keep their data, for the report.
	dataDir         string
	warmup, measure time.Duration
}

// The arms of section 9, by the names the report gives them.
const (
	standbyInsertOnly = "insert-only (standby running, no walcount)"
	standbyOnPrimary  = "walcount decoding on the primary"
	standbyOnStandby  = "walcount decoding on the standby"
	standbyControl    = "control: insert-only, CPU 1 kept busy (a spin loop, no walcount)"
)

func runStandbyBench(ctx context.Context, b *bench) (string, error) {
	if _, err := exec.LookPath("taskset"); err != nil {
		return "", fmt.Errorf("the standby section needs taskset: %w", err)
	}
	r := &standbyRun{b: b, dataDir: "the disk of -data-dir"}
	// On memory the primary's 8 clients are bound by its CPU, which is
	// what this section measures; on a disk they wait on the WAL's
	// flushes, the CPU has room that hides the cost, and the disk's
	// noise decides (one run: insert-only rounds from 5715 to 8112 txn/s).
	if b.standbyDir != "" {
		if st, err := os.Stat(b.standbyDir); err == nil && st.IsDir() {
			prev := os.Getenv(servers.EnvTempDir)
			os.Setenv(servers.EnvTempDir, b.standbyDir)
			defer os.Setenv(servers.EnvTempDir, prev)
			r.dataDir = b.standbyDir
		}
	}
	c, err := newCluster(ctx, 1000)
	if err != nil {
		return "", err
	}
	defer c.close()
	r.c = c
	if c.pg.Major() < 16 {
		return fmt.Sprintf("## 9. Decoding on a standby\n\nSkipped: PostgreSQL %d cannot decode on a standby (16 and later).\n\n", c.pg.Major()), nil
	}
	closeStandby, err := r.startStandby(ctx)
	if err != nil {
		return "", err
	}
	defer closeStandby()
	defer func() { _ = pinSelf("0-" + strconv.Itoa(runtime.NumCPU()-1)) }()
	if err := r.pin(); err != nil {
		return "", err
	}
	r.warmup, r.measure = 2*time.Second, 10*time.Second
	if b.quick {
		r.warmup, r.measure = time.Second, 4*time.Second
	}
	if b.standbyWarmup > 0 {
		r.warmup = b.standbyWarmup
	}
	if b.standbyMeasure > 0 {
		r.measure = b.standbyMeasure
	}
	runs, rounds, err := r.rounds(ctx)
	if err != nil {
		return "", err
	}
	return r.report(runs, rounds), nil
}

// startStandby starts the primary's hot standby and opens a pool on it;
// the func it returns closes both.
func (r *standbyRun) startStandby(ctx context.Context) (func(), error) {
	// No copies of the primary arm's failover slot on the standby: the
	// standby arm makes a slot of that name there.
	var sopt servers.StandbyOptions
	if r.c.pg.Major() >= 17 {
		sopt.Settings = map[string]string{"sync_replication_slots": "off"}
	}
	standby, err := r.c.pg.StartStandby(ctx, sopt)
	if err != nil {
		return nil, err
	}
	r.c.db.Reset() // the standby's copy restarted the primary
	sb, err := pgxpool.New(ctx, standby.URL())
	if err != nil {
		standby.Close()
		return nil, err
	}
	r.standby, r.sb = standby, sb
	return func() { sb.Close(); standby.Close() }, nil
}

// pin puts the primary and the load generator on CPU 0, the standby and
// Redis on CPU 1.
func (r *standbyRun) pin() error {
	// The load generator (this process: its clients are goroutines) runs
	// beside the primary on CPU 0, as the app would on the primary's side:
	// unpinned, it ran on CPU 1 too and took the standby arm's decoding
	// work there for a cost on the primary.
	if err := pinSelf("0"); err != nil {
		return err
	}
	if err := pinTree(r.c.pg.PID(), "0"); err != nil {
		return err
	}
	if err := pinTree(r.standby.PID(), "1"); err != nil {
		return err
	}
	return pinTree(r.c.redis.PID(), "1")
}

// rounds runs the arms in rounds, insert-only first and the others in an
// order that alternates (primary, standby, control; then control,
// standby, primary), after an insert-only run that is not counted: the
// first minute of a fresh pair of clusters is slower (one run measured
// 5757 txn/s there and 8148 at the end), and the arm that ran first took
// it. It returns each arm's rounds by its name.
func (r *standbyRun) rounds(ctx context.Context) (map[string][]standbyArm, int, error) {
	rounds := 5
	if r.b.quick {
		rounds = 1
	}
	r.b.logf("   warm-up (not counted)")
	if _, err := r.insertOnly(ctx, "warm-up"); err != nil {
		return nil, 0, fmt.Errorf("warm-up: %w", err)
	}
	runs := map[string][]standbyArm{}
	for i := 0; i < rounds; i++ {
		order := []string{standbyInsertOnly, standbyOnPrimary, standbyOnStandby, standbyControl}
		if i%2 == 1 {
			order = []string{standbyInsertOnly, standbyControl, standbyOnStandby, standbyOnPrimary}
		}
		for _, name := range order {
			r.b.logf("   round %d: %s", i+1, name)
			var a standbyArm
			var err error
			switch name {
			case standbyInsertOnly:
				a, err = r.insertOnly(ctx, name)
			case standbyControl:
				a, err = r.busyOther(ctx, name)
			case standbyOnPrimary:
				a, err = r.walcountArm(ctx, name, false)
			default:
				a, err = r.walcountArm(ctx, name, true)
			}
			if err != nil {
				return nil, 0, fmt.Errorf("round %d: %s: %w", i+1, name, err)
			}
			runs[name] = append(runs[name], a)
		}
	}
	return runs, rounds, nil
}

// load runs the hot-post write path for the warm-up and the measured
// time.
func (r *standbyRun) load(ctx context.Context) (runResult, error) {
	return closedLoop(ctx, r.c.url, standbyClients, workload{name: "hot post", hot: true}, styleInsert, r.warmup, r.measure)
}

// insertOnly is the arm without walcount.
func (r *standbyRun) insertOnly(ctx context.Context, name string) (standbyArm, error) {
	res, err := r.load(ctx)
	if err != nil {
		return standbyArm{}, err
	}
	// Every arm starts from no likes: a walcount arm after this one
	// would otherwise begin with a backfill of them.
	_, err = r.c.db.Exec(ctx, `TRUNCATE likes`)
	return standbyArm{name: name, tps: res.tps()}, err
}

// busyOther is the control: what the primary loses when the other CPU is
// busy with anything at all. On a virtual machine two vCPUs may share a
// physical core (SMT) or its caches, and then work on CPU 1 slows CPU 0
// though no process of the primary's waits for it.
func (r *standbyRun) busyOther(ctx context.Context, name string) (standbyArm, error) {
	spin := exec.Command("taskset", "-c", "1", "sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		return standbyArm{}, err
	}
	defer func() { _ = spin.Process.Kill(); _ = spin.Wait() }()
	return r.insertOnly(ctx, name)
}

// standbyUsage is one reading of the CPU an arm measures and of the
// likes counted.
type standbyUsage struct {
	sender, wc, redisCPU time.Duration
	onPrimary            map[int]time.Duration
	likes                int64
}

// usage reads the CPU of the slot's walsender (on senderDB's server), of
// walcount's sessions on the primary, of walcount and of Redis, and the
// likes counted.
func (r *standbyRun) usage(ctx context.Context, w *walcountProc, senderDB *pgxpool.Pool) (standbyUsage, error) {
	var u standbyUsage
	var err error
	if u.sender, err = slotSenderCPU(ctx, senderDB); err != nil {
		return u, err
	}
	if u.onPrimary, err = walcountBackendsCPU(ctx, r.c.db); err != nil {
		return u, err
	}
	wu, _ := w.usage()
	ru, _ := procUsage(r.c.redis.PID())
	u.wc, u.redisCPU = wu.cpu, ru.cpu
	u.likes, err = r.c.likesCount(ctx)
	return u, err
}

// walcountArm measures the write path with walcount decoding on the
// primary or, onStandby, on the standby, and then drains it.
func (r *standbyRun) walcountArm(ctx context.Context, name string, onStandby bool) (standbyArm, error) {
	a := standbyArm{name: name}
	cfg := r.c.walcountConfig()
	extra := []string{}
	senderDB := r.c.db
	if onStandby {
		cfg.ReplicationURL = r.standby.URL()
		extra = append(extra, "--replication-url", r.standby.URL())
		senderDB = r.sb
	}
	w, err := r.startArmWalcount(ctx, cfg, extra)
	if err != nil {
		return a, err
	}
	defer func() { _ = w.stop() }()
	u0, err := r.usage(ctx, w, senderDB)
	if err != nil {
		return a, err
	}
	res, err := r.load(ctx)
	if err != nil {
		return a, err
	}
	a.tps = res.tps()
	if err := r.c.settled(ctx, 5*time.Minute); err != nil {
		return a, err
	}
	u1, err := r.usage(ctx, w, senderDB)
	if err != nil {
		return a, err
	}
	for pid, cpu := range u1.onPrimary {
		a.onPrimary += cpu - u0.onPrimary[pid] // a session opened since counts whole
	}
	a.changes = u1.likes - u0.likes
	a.sender, a.wc, a.redisCPU = u1.sender-u0.sender, u1.wc-u0.wc, u1.redisCPU-u0.redisCPU
	if err := w.stop(); err != nil {
		return a, err
	}
	if err := r.c.verify(ctx); err != nil {
		return a, fmt.Errorf("%s: %w", name, err)
	}
	return a, r.resetArm(ctx, senderDB)
}

// startArmWalcount sets walcount up with cfg, starts it with the extra
// flags, pins it to CPU 1 and waits until it has caught up.
func (r *standbyRun) startArmWalcount(ctx context.Context, cfg config.Config, extra []string) (*walcountProc, error) {
	conn, err := pgx.Connect(ctx, r.c.url)
	if err != nil {
		return nil, err
	}
	err = setupWith(ctx, conn, cfg)
	conn.Close(context.Background())
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	w, err := startWalcount(r.b.bin, r.b.tmp, r.c, extra...)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = w.stop()
		}
	}()
	if err := w.waitMetrics(ctx); err != nil {
		return nil, err
	}
	if err := pinTree(w.cmd.Process.Pid, "1"); err != nil {
		return nil, err
	}
	if err := r.c.caughtUp(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	ok = true
	return w, nil
}

// resetArm leaves the clusters as the next arm starts from: no slot, no
// state, no buffer, no likes.
func (r *standbyRun) resetArm(ctx context.Context, senderDB *pgxpool.Pool) error {
	if _, err := senderDB.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_type = 'logical'`); err != nil {
		return err
	}
	if _, err := r.c.db.Exec(ctx, `DROP SCHEMA walcount CASCADE; DROP PUBLICATION walcount; UPDATE posts SET likes_count = 0; TRUNCATE likes`); err != nil {
		return err
	}
	return r.c.redisFlushAll(ctx)
}

// report is section 9's text: each arm's medians over the rounds.
func (r *standbyRun) report(runs map[string][]standbyArm, rounds int) string {
	median := func(as []standbyArm) standbyArm {
		sorted := slices.Clone(as)
		slices.SortFunc(sorted, func(x, y standbyArm) int { return cmp.Compare(x.tps, y.tps) })
		return sorted[len(sorted)/2]
	}
	// The ratio of a round is the arm's txn/s over the same round's
	// insert-only run (and over its control run), so that the machine's
	// drift between rounds (the disk's, other load's) cancels; an arm's
	// ratio is the median of its rounds'.
	ratio := func(name, base string) float64 {
		var rs []float64
		for i, r := range runs[name] {
			rs = append(rs, r.tps/runs[base][i].tps)
		}
		slices.Sort(rs)
		return rs[len(rs)/2]
	}
	var out strings.Builder
	fmt.Fprintf(&out, "## 9. Decoding on a standby, the primary pinned\n\n")
	fmt.Fprintf(&out, "PostgreSQL %d, both clusters on %s. Primary and the load generator (the app's side) on CPU 0; its hot standby, Redis and walcount on CPU 1 (taskset). "+
		"Hot-post write path, %d clients, one INSERT per transaction, %s warm-up, %s measured, after one uncounted insert-only run. "+
		"%d rounds, the order of the arms alternating. A round's ratio is the arm's txn/s over that round's insert-only txn/s (× insert-only) "+
		"and over that round's control, insert-only with CPU 1 kept busy by a spin loop (× control: what work of any kind on CPU 1 costs CPU 0 on this machine); "+
		"each row gives the median ratios, the median txn/s and every round's txn/s. "+
		"CPU per change (from the arm's median-txn/s round) over the arm and its drain, per counted change; the walsender is the slot's, on the primary or on the standby; walcount's sessions on the primary are its SQL connections there (flushes, heartbeats, markers), its walsender apart.\n\n",
		r.c.pg.Major(), r.dataDir, standbyClients, r.warmup, r.measure, rounds)
	fmt.Fprintf(&out, "| arm | × insert-only | × control | txn/s | walsender µs/change | walcount µs/change | Redis µs/change | walcount's sessions on the primary µs/change | rounds: txn/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, name := range []string{standbyInsertOnly, standbyOnPrimary, standbyOnStandby, standbyControl} {
		a := median(runs[name])
		var all []string
		for _, r := range runs[name] {
			all = append(all, fmt.Sprintf("%.0f", r.tps))
		}
		fmt.Fprintf(&out, "| %s | %.2f | %.2f | %.0f | %s | %s | %s | %s | %s |\n", a.name, ratio(name, standbyInsertOnly), ratio(name, standbyControl), a.tps,
			a.perChange(a.sender), a.perChange(a.wc), a.perChange(a.redisCPU), a.perChange(a.onPrimary), strings.Join(all, ", "))
	}
	out.WriteString("\n")
	return out.String()
}

// walcountBackendsCPU returns the CPU time of each SQL session walcount
// holds on the server db reaches (application_name walcount, its
// walsender excluded), by backend pid. A session closed between two
// readings is missed: walcount's pools keep theirs open.
func walcountBackendsCPU(ctx context.Context, db *pgxpool.Pool) (map[int]time.Duration, error) {
	rows, err := db.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'walcount' AND backend_type = 'client backend'`)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	out := map[int]time.Duration{}
	for _, pid := range pids {
		if u, err := procUsage(int(pid)); err == nil {
			out[int(pid)] = u.cpu
		}
	}
	return out, nil
}

// slotSenderCPU returns the CPU time of the walsender of the one active
// logical slot of the server db reaches.
func slotSenderCPU(ctx context.Context, db *pgxpool.Pool) (time.Duration, error) {
	var pid *int32
	if err := db.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_type = 'logical' AND active`).Scan(&pid); err != nil {
		return 0, fmt.Errorf("read walsender pid: %w", err)
	}
	if pid == nil {
		return 0, fmt.Errorf("no walsender")
	}
	u, err := procUsage(int(*pid))
	return u.cpu, err
}

// setupWith runs walcount setup with cfg on conn (the primary).
func setupWith(ctx context.Context, conn *pgx.Conn, cfg config.Config) error {
	_, err := setup.Run(ctx, conn, setup.Options{Config: cfg})
	return err
}

// redisFlushAll empties the cluster's Redis.
func (c *cluster) redisFlushAll(ctx context.Context) error {
	ropt, err := redisconn.Parse(c.redis.URL(), redisconn.TLSOptions{})
	if err != nil {
		return err
	}
	rdb := redisconn.New(ropt, nil)
	defer rdb.Close()
	return rdb.FlushAll(ctx).Err()
}
