package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// Reconcile section.
const (
	fullReconcilePosts   = 1_000_000
	quickReconcilePosts  = 100_000
	reconcileLikesPer    = 5     // likes per post on average
	reconcileDrift       = 1_000 // drifted posts in a full run
	quickReconcileDrift  = 200
	reconcileLightRate   = 60 // transactions/s of the light load during the timed pass
	reconcileLightConns  = 2
	reconcileWriteConns  = 8 // closed-loop clients of the write-path comparison
	reconcileLimitedRate = 100_000
)

// truthSQL computes the truth once: every post's COUNT(*) of likes, by a
// GROUP BY over likes and a scan of posts, compared with likes_count.
const truthSQL = `SELECT count(*) FILTER (WHERE p.likes_count <> coalesce(l.n, 0)), count(*)
FROM posts p LEFT JOIN (SELECT post_id, count(*) AS n FROM likes GROUP BY post_id) l ON l.post_id = p.id`

// reconcileResult is the reconcile section.
type reconcileResult struct {
	posts, likes int64
	build        time.Duration // data load, not measured
	// truth is the fastest of two runs of truthSQL; truthOff is the
	// number of posts it found off (the injected drift).
	truth    time.Duration
	truthOff int64
	injected int64
	pass     passResult
	// light is the achieved rate of the light load during the pass.
	light float64
	// write-path impact: likes/s of closed-loop clients with no pass, with
	// a pass at full speed and with a pass at the rate limit.
	writeIdle, writeFull, writeLimited loopResult
	passFull, passLimited              passResult
	// backfill is a pass over the table with every count 0; backfillOff
	// the posts that have likes.
	backfill    passResult
	backfillOff int64
	limit       int
	exact       bool
	took        time.Duration // the whole section
}

// passResult is one full reconciliation pass as the daemon reported it.
type passResult struct {
	elapsed                     time.Duration
	checked, drifted, corrected int64
	status, err                 string
}

func (p passResult) keysPerSecond() float64 { return float64(p.checked) / p.elapsed.Seconds() }

// loopResult is what closed-loop writers did in a window.
type loopResult struct {
	likes   int64
	elapsed time.Duration
}

func (l loopResult) rate() float64 {
	if l.elapsed <= 0 {
		return 0
	}
	return float64(l.likes) / l.elapsed.Seconds()
}

// errDriftMismatch means the pass did not find exactly the drift the
// bench injected.
var errDriftMismatch = errors.New("the reconciliation did not find exactly the injected drift")

// runReconcile measures a full reconciliation pass on a large table
// against one truth computation of the same data, and what a pass costs
// the app's write path.
func runReconcile(ctx context.Context, b *bench) (*reconcileResult, error) {
	posts, drift := int64(fullReconcilePosts), int64(reconcileDrift)
	if b.quick {
		posts, drift = quickReconcilePosts, quickReconcileDrift
	}
	if b.reconcilePosts > 0 {
		posts = b.reconcilePosts
		drift = max(1, min(drift, posts/1000))
	}
	if err := checkReconcileConfig(b.reconcileConfig); err != nil {
		return nil, err
	}
	res := &reconcileResult{posts: posts, injected: drift, limit: reconcileLimitedRate}
	c, err := newCluster(ctx, int(posts))
	if err != nil {
		return nil, err
	}
	defer c.close()
	if err := buildReconciled(ctx, b, c, res); err != nil {
		return nil, err
	}
	wc, stopWalcount, err := startReconcileWalcount(ctx, b, c)
	if err != nil {
		return nil, err
	}
	defer stopWalcount()
	if err := injectDrift(ctx, c, posts, drift); err != nil {
		return nil, err
	}

	// The light load runs from here to the end of the timed pass.
	light := startLightLoad(ctx, c.url, posts)
	defer light.stop()
	if err := timeTruth(ctx, c, res); err != nil {
		return nil, err
	}
	b.logf("  truth computation: %s (%d posts off)", res.truth.Round(time.Millisecond), res.truthOff)

	if res.pass, err = reconcilePass(ctx, wc, b.reconcileBatch, 0); err != nil {
		return nil, err
	}
	if err := light.stop(); err != nil {
		return nil, err
	}
	res.light = float64(light.likes) / time.Since(light.started).Seconds()
	b.logf("  full pass: %s, %d keys (%.0f keys/s), %d drifted, %d corrected; %.2f× the truth computation",
		res.pass.elapsed.Round(time.Millisecond), res.pass.checked, res.pass.keysPerSecond(), res.pass.drifted, res.pass.corrected,
		res.pass.elapsed.Seconds()/res.truth.Seconds())
	if err := c.verifySettled(ctx); err != nil {
		return nil, err
	}
	res.exact = true
	if res.pass.drifted != drift || res.pass.corrected != drift {
		return res, fmt.Errorf("%w: %d posts drifted by the bench, the pass found %d and corrected %d (%s)", errDriftMismatch, drift, res.pass.drifted, res.pass.corrected, res.pass.err)
	}

	if err := measureBackfill(ctx, b, c, wc, res); err != nil {
		res.exact = false
		return res, err
	}
	if !b.reconcileWrite {
		return res, nil
	}
	return measurePassWritePath(ctx, b, c, wc, res)
}

// checkReconcileConfig refuses a -reconcile-config file that the section
// cannot measure: its table is the default counter's and its marks are
// read on the default slot.
func checkReconcileConfig(path string) error {
	if path == "" {
		return nil
	}
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false }, config.Overrides{})
	if err != nil {
		return fmt.Errorf("-reconcile-config: %w", err)
	}
	if len(cfg.Counters) != 1 || !reflect.DeepEqual(cfg.Counters[0], counter.Default()) {
		return fmt.Errorf("-reconcile-config %s: the section measures the default counter only; leave out counters", path)
	}
	if cfg.Slot != config.DefaultSlot {
		return fmt.Errorf("-reconcile-config %s: the section reads the checkpoint of slot %q; leave out slot", path, config.DefaultSlot)
	}
	return nil
}

// buildReconciled builds the section's table, exact, and sets walcount up
// on it with its backfill marked done.
func buildReconciled(ctx context.Context, b *bench, c *cluster, res *reconcileResult) error {
	began := time.Now()
	if err := buildReconcileData(ctx, c, res.posts, res.posts*reconcileLikesPer); err != nil {
		return err
	}
	res.build = time.Since(began)
	var err error
	if res.likes, err = c.likesCount(ctx); err != nil {
		return err
	}
	b.logf("  %d posts, %d likes built in %s", res.posts+1, res.likes, res.build.Round(time.Second))
	if err := c.setup(ctx); err != nil {
		return fmt.Errorf("walcount setup: %w", err)
	}
	// The counts are exact already: no first-start backfill.
	return state.NewRuns(c.db, config.DefaultSlot).Backfilled(ctx, counter.Default())
}

// startReconcileWalcount starts the section's walcount and waits until it
// has caught up; the func it returns stops it (and keeps its log, when
// the section's walcount has flags of its own).
func startReconcileWalcount(ctx context.Context, b *bench, c *cluster) (*walcountProc, func(), error) {
	flags := b.reconcileWalcountFlags
	if b.reconcileConfig != "" {
		flags = append([]string{"--config", b.reconcileConfig}, flags...)
	}
	wc, err := startWalcount(b.bin, b.tmp, c, flags...)
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		if len(b.reconcileWalcountFlags) > 0 {
			keep := filepath.Join(os.TempDir(), "walcount-bench-reconcile.log")
			if data, err := os.ReadFile(wc.logPath); err == nil && os.WriteFile(keep, data, 0o644) == nil {
				b.logf("  walcount's log: %s", keep)
			}
		}
		wc.stop()
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = wc.waitMetrics(sctx)
	cancel()
	if err == nil {
		err = c.caughtUp(ctx, time.Minute)
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return wc, stop, nil
}

// injectDrift puts drift posts' counts off by 1 to 3 either way: random
// posts, the first and the last among them.
func injectDrift(ctx context.Context, c *cluster, posts, drift int64) error {
	keys := driftKeys(posts, drift)
	deltas := make([]int64, len(keys))
	for i := range deltas {
		deltas[i] = int64(1 + i%3)
		if i%2 == 1 {
			deltas[i] = -deltas[i]
		}
	}
	if _, err := c.db.Exec(ctx, `UPDATE posts p SET likes_count = p.likes_count + d.delta FROM unnest($1::bigint[], $2::bigint[]) AS d(id, delta) WHERE p.id = d.id`, keys, deltas); err != nil {
		return fmt.Errorf("inject drift: %w", err)
	}
	return nil
}

// lightLoad is the paced load that runs during the timed pass.
type lightLoad struct {
	cancel  context.CancelFunc
	done    chan struct{}
	started time.Time
	likes   int64 // once stopped
	err     error
}

func startLightLoad(ctx context.Context, url string, posts int64) *lightLoad {
	lctx, cancel := context.WithCancel(ctx)
	l := &lightLoad{cancel: cancel, done: make(chan struct{}), started: time.Now()}
	go func() {
		defer close(l.done)
		l.likes, l.err = pacedLoad(lctx, url, reconcileLightConns, reconcileLightRate, workload{name: "uniform", uniform: posts})
	}()
	return l
}

// stop ends the load and waits for it; calling it again is harmless.
func (l *lightLoad) stop() error {
	l.cancel()
	<-l.done
	if l.err != nil && !errors.Is(l.err, context.Canceled) {
		return l.err
	}
	return nil
}

// timeTruth times the truth computation, the best of two.
func timeTruth(ctx context.Context, c *cluster, res *reconcileResult) error {
	for range 2 {
		t0 := time.Now()
		var off, total int64
		if err := c.db.QueryRow(ctx, truthSQL).Scan(&off, &total); err != nil {
			return fmt.Errorf("truth: %w", err)
		}
		if d := time.Since(t0); res.truth == 0 || d < res.truth {
			res.truth, res.truthOff = d, off
		}
	}
	return nil
}

// measurePassWritePath measures the write path with and without a pass
// running (at full speed; at the limited rate too in a full run).
func measurePassWritePath(ctx context.Context, b *bench, c *cluster, wc *walcountProc, res *reconcileResult) (*reconcileResult, error) {
	posts := res.posts
	window := max(res.pass.elapsed, 3*time.Second)
	if b.quick {
		window = min(window, 5*time.Second)
	}
	var err error
	if res.writeIdle, err = writeLoop(ctx, c.url, posts, window, nil); err != nil {
		return nil, err
	}
	res.writeFull, res.passFull, err = writeDuringPass(ctx, c, wc, posts, b.reconcileBatch, 0)
	if err != nil {
		return nil, err
	}
	if res.passFull.drifted != 0 {
		return res, fmt.Errorf("%w: a pass under write load with no drift left found %d drifted keys", errDriftMismatch, res.passFull.drifted)
	}
	b.logf("  write path, %d clients: %.0f likes/s idle, %.0f likes/s during a full-speed pass (%s)",
		reconcileWriteConns, res.writeIdle.rate(), res.writeFull.rate(), res.passFull.elapsed.Round(time.Millisecond))
	if !b.quick {
		res.writeLimited, res.passLimited, err = writeDuringPass(ctx, c, wc, posts, b.reconcileBatch, reconcileLimitedRate)
		if err != nil {
			return nil, err
		}
		if res.passLimited.drifted != 0 {
			return res, fmt.Errorf("%w: a pass under write load with no drift left found %d drifted keys", errDriftMismatch, res.passLimited.drifted)
		}
		b.logf("  write path during a pass limited to %d keys/s: %.0f likes/s (%s)",
			reconcileLimitedRate, res.writeLimited.rate(), res.passLimited.elapsed.Round(time.Millisecond))
	}
	if err := c.verifySettled(ctx); err != nil {
		res.exact = false
		return res, err
	}
	return res, nil
}

// measureBackfill times a pass over a table whose every count is 0, as
// at a first start on a table that has rows: every key with likes is off
// and corrected.
func measureBackfill(ctx context.Context, b *bench, c *cluster, wc *walcountProc, res *reconcileResult) error {
	if _, err := c.db.Exec(ctx, `UPDATE posts SET likes_count = 0 WHERE likes_count <> 0`); err != nil {
		return fmt.Errorf("zero the counts: %w", err)
	}
	if err := c.db.QueryRow(ctx, `SELECT count(DISTINCT post_id) FROM likes`).Scan(&res.backfillOff); err != nil {
		return err
	}
	if _, err := c.db.Exec(ctx, `VACUUM posts`); err != nil {
		return err
	}
	var err error
	if res.backfill, err = reconcilePass(ctx, wc, b.reconcileBatch, 0); err != nil {
		return err
	}
	b.logf("  pass over %d keys all off (a first-start backfill): %s, %d corrected", res.backfill.checked, res.backfill.elapsed.Round(time.Millisecond), res.backfill.corrected)
	if res.backfill.corrected != res.backfillOff {
		return fmt.Errorf("%w: %d posts had likes and a count of 0, the pass corrected %d", errDriftMismatch, res.backfillOff, res.backfill.corrected)
	}
	return c.verifySettled(ctx)
}

// buildReconcileData loads likes posts at random (uniform) and sets every
// post's likes_count to its true count, then vacuums, as a table that
// has been in production for a while is.
func buildReconcileData(ctx context.Context, c *cluster, posts, likes int64) error {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, q := range []string{
		`SET synchronous_commit = off`,
		`SET maintenance_work_mem = '512MB'`,
		`DROP INDEX likes_post_id_idx`,
		fmt.Sprintf(`INSERT INTO likes (post_id, user_id) SELECT 1 + floor(random() * %d)::bigint, g FROM generate_series(1, %d) g`, posts, likes),
		`CREATE INDEX likes_post_id_idx ON likes (post_id)`,
		`UPDATE posts p SET likes_count = l.n FROM (SELECT post_id, count(*) AS n FROM likes GROUP BY post_id) l WHERE l.post_id = p.id`,
		`VACUUM (ANALYZE) posts`,
		`VACUUM (ANALYZE) likes`,
		// A second vacuum marks the pages the first left out in the
		// visibility map, as autovacuum keeps an append-mostly table:
		// counting by the index then reads no table pages.
		`VACUUM likes`,
		`CHECKPOINT`,
		`RESET synchronous_commit`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("build data: %s: %w", q, err)
		}
	}
	return nil
}

// driftKeys returns n distinct posts in 1..posts: the first, the last and
// others at random.
func driftKeys(posts, n int64) []int64 {
	rng := rand.New(rand.NewPCG(42, 15))
	seen := map[int64]bool{1: true, posts: true}
	out := []int64{1, posts}
	for int64(len(out)) < n {
		k := 1 + rng.Int64N(posts)
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out[:n]
}

// reconcilePass runs one full pass through the daemon's API, as
// walcount reconcile does, and waits for its end.
func reconcilePass(ctx context.Context, wc *walcountProc, batch, limit int) (passResult, error) {
	req := reconcile.Request{BatchSize: batch}
	if limit > 0 {
		req.MaxKeysPerSecond = &limit
	}
	body, _ := json.Marshal(req)
	start := time.Now()
	resp, err := http.Post("http://"+wc.addr+"/v1/reconcile", "application/json", bytes.NewReader(body))
	if err != nil {
		return passResult{}, err
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return passResult{}, fmt.Errorf("start reconciliation: %s: %s", resp.Status, data)
	}
	var run reconcile.RunInfo
	if err := json.Unmarshal(data, &run); err != nil {
		return passResult{}, err
	}
	for {
		select {
		case <-ctx.Done():
			return passResult{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if err := wc.alive(); err != nil {
			return passResult{}, err
		}
		st, err := daemonReconcileStatus(ctx, wc.addr)
		if err != nil {
			return passResult{}, err
		}
		if st.Last != nil && st.Last.ID == run.ID && (st.Current == nil || st.Current.ID != run.ID) {
			l := st.Last
			p := passResult{elapsed: time.Since(start), checked: l.KeysChecked, drifted: l.Drifted, corrected: l.Corrected, status: l.Status, err: l.Error}
			if l.Status != state.StatusDone {
				return p, fmt.Errorf("reconciliation %d %s: %s", run.ID, l.Status, l.Error)
			}
			return p, nil
		}
	}
}

func daemonReconcileStatus(ctx context.Context, addr string) (reconcile.Status, error) {
	r, err := httpapi.Get(ctx, addr, "/status", 1<<20)
	if err != nil {
		return reconcile.Status{}, err
	}
	var s struct {
		Reconcile reconcile.Status `json:"reconcile"`
	}
	if err := json.Unmarshal(r.Body, &s); err != nil {
		return reconcile.Status{}, fmt.Errorf("parse /status: %w", err)
	}
	return s.Reconcile, nil
}

// writeDuringPass runs closed-loop writers for the length of one full
// pass at limit keys/s (0: unlimited).
func writeDuringPass(ctx context.Context, c *cluster, wc *walcountProc, posts int64, batch, limit int) (loopResult, passResult, error) {
	stop := make(chan struct{})
	var lr loopResult
	var lerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		lr, lerr = writeLoop(ctx, c.url, posts, 0, stop)
	}()
	p, err := reconcilePass(ctx, wc, batch, limit)
	close(stop)
	<-done
	if err == nil {
		err = lerr
	}
	return lr, p, err
}

// writeLoop runs reconcileWriteConns clients that insert likes on random
// posts back to back, for window or until stop closes.
func writeLoop(ctx context.Context, url string, posts int64, window time.Duration, stop <-chan struct{}) (loopResult, error) {
	conns, closeAll, err := connectAll(ctx, url, reconcileWriteConns)
	if err != nil {
		return loopResult{}, err
	}
	defer closeAll()
	var n atomic.Int64
	var stopped atomic.Bool
	errs := make([]error, len(conns))
	start := time.Now()
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i)+7, 99))
			user := int64(i) << 32
			for !stopped.Load() {
				user++
				if _, err := conn.Exec(ctx, insertSQL, 1+rng.Int64N(posts), user); err != nil {
					errs[i] = err
					return
				}
				n.Add(1)
			}
		})
	}
	var timer <-chan time.Time
	if window > 0 {
		timer = time.After(window)
	}
	select {
	case <-ctx.Done():
	case <-stop:
	case <-timer:
	}
	stopped.Store(true)
	elapsed := time.Since(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return loopResult{}, err
	}
	return loopResult{likes: n.Load(), elapsed: elapsed}, ctx.Err()
}

// reconcileSection writes section 7.
func (r *results) reconcileSection(b *strings.Builder) {
	x := r.reconcile
	fmt.Fprintf(b, "## 7. Reconciliation of a large table\n\n")
	fmt.Fprintf(b, "%s posts, %s likes (index on `likes(post_id)`, vacuumed), every count exact but %s posts drifted by ±1..3 "+
		"(among them the first and the last post); a light load of %d likes/s (%d paced clients, uniform over the posts) runs during the timed pass. "+
		"The truth computation is one query, a `GROUP BY post_id` over likes joined to a scan of posts (the faster of two runs, same cluster, same load); "+
		"the pass is `POST /v1/reconcile` (what `walcount reconcile` sends) until the daemon reports it done. Built in %s; the section took %s.\n\n",
		thousands(float64(x.posts+1)), thousands(float64(x.likes)), thousands(float64(x.injected)),
		reconcileLightRate, reconcileLightConns, x.build.Round(time.Second), x.took.Round(time.Second))
	fmt.Fprintf(b, "| truth computation | full pass | pass / truth | keys checked | keys/s | per 1M keys | drifted: injected / found / corrected | light load achieved |\n|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	p := x.pass
	if p.elapsed > 0 {
		fmt.Fprintf(b, "| %s | %s | %.2f× | %s | %s | %s | %s / %s / %s | %.0f likes/s |\n",
			dur(x.truth), dur(p.elapsed), p.elapsed.Seconds()/x.truth.Seconds(), thousands(float64(p.checked)),
			thousands(p.keysPerSecond()), dur(time.Duration(float64(p.elapsed)/float64(max(p.checked, 1))*1e6)),
			thousands(float64(x.injected)), thousands(float64(p.drifted)), thousands(float64(p.corrected)), x.light)
	}
	if bf := x.backfill; bf.elapsed > 0 {
		fmt.Fprintf(b, "\nThe same pass once every count is 0, as at a first start on a table that has rows (the backfill): "+
			"%s keys, %s of them off and corrected (each measured twice, then one UPDATE per key through the stream), in %s (%s keys/s).\n",
			thousands(float64(bf.checked)), thousands(float64(bf.corrected)), dur(bf.elapsed), thousands(bf.keysPerSecond()))
	}
	if x.writeIdle.elapsed > 0 {
		fmt.Fprintf(b, "\nThe app's write path during a pass: %d closed-loop clients insert likes on random posts, with no pass running, then for the length of a full pass "+
			"(no drift left), at full speed and limited to `max_keys_per_second: %s`.\n\n", reconcileWriteConns, thousands(float64(x.limit)))
		fmt.Fprintf(b, "| | likes/s | ratio to no pass | pass time |\n|---|--:|--:|--:|\n")
		fmt.Fprintf(b, "| no pass | %s | 1.00× | – |\n", thousands(x.writeIdle.rate()))
		if x.writeFull.elapsed > 0 {
			fmt.Fprintf(b, "| full-speed pass | %s | %s | %s |\n", thousands(x.writeFull.rate()), ratio(x.writeFull.rate(), x.writeIdle.rate()), dur(x.passFull.elapsed))
		}
		if x.writeLimited.elapsed > 0 {
			fmt.Fprintf(b, "| pass at %s keys/s | %s | %s | %s |\n", thousands(float64(x.limit)), thousands(x.writeLimited.rate()), ratio(x.writeLimited.rate(), x.writeIdle.rate()), dur(x.passLimited.elapsed))
		}
	}
	if r.reconcileErr != nil {
		fmt.Fprintf(b, "\n**FAILED**: %v\n", r.reconcileErr)
	}
	b.WriteString("\n")
}
