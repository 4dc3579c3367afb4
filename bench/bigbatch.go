package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/redisconn"
)

// Section 9: one batch of a bulk insert (issue 26). N posts, then one
// statement likes every post; walcount runs meanwhile. Measured: the time
// from the insert's commit until every post is exact, walcount's peak RSS
// and Redis's used_memory_peak, the longest wait of a Redis PING and of
// an app's lock of one random post's row (what its own UPDATE would wait
// for) while walcount flushes, and the longest walcount script in Redis's
// slow log. One more run of the largest size kills walcount (SIGKILL)
// in the middle of the flush and starts it again.

// bigSizes are the batch sizes of a full run and of a quick one.
var (
	bigSizes      = []int64{100_000, 1_000_000, 2_000_000}
	bigSizesQuick = []int64{100_000}
)

// bigResult is one batch.
type bigResult struct {
	keys      int64
	killed    bool // walcount was killed with SIGKILL mid-flush, and restarted
	insert    time.Duration
	exact     time.Duration // from the insert's commit until every post is exact
	rss       int64         // walcount's peak RSS (VmHWM), bytes; 0 when killed
	redisPeak int64         // used_memory_peak, bytes
	ping      time.Duration // longest PING
	pings     int
	lock      time.Duration // longest app lock of one post's row
	locks     int
	slowLock  int           // app locks that waited more than 500 ms
	script    time.Duration // longest walcount script in the slow log (0: none over 10 ms)
	pieces    float64       // walcount_flush_pieces_total
}

// runBig measures section 11.
func runBig(ctx context.Context, b *bench) ([]bigResult, error) {
	sizes := bigSizes
	if b.quick {
		sizes = bigSizesQuick
	}
	if len(b.bigSizes) > 0 {
		sizes = b.bigSizes
	}
	var out []bigResult
	for i, n := range sizes {
		kills := []bool{false}
		if i == len(sizes)-1 {
			kills = append(kills, true)
		}
		for _, kill := range kills {
			r, err := bigOne(ctx, b, n, kill)
			if err != nil {
				return out, fmt.Errorf("big batch of %d keys: %w", n, err)
			}
			b.logf("  %d keys%s: insert %s, exact %s after its commit; walcount peak RSS %.0f MiB, Redis used_memory_peak %.0f MiB; "+
				"longest PING %s, longest app row lock %s (%d of %d over 500 ms), longest walcount script %s; %v pieces",
				r.keys, map[bool]string{true: " (SIGKILL mid-flush)"}[r.killed], r.insert.Round(time.Millisecond), r.exact.Round(time.Millisecond),
				float64(r.rss)/(1<<20), float64(r.redisPeak)/(1<<20), r.ping.Round(time.Millisecond), r.lock.Round(time.Millisecond),
				r.slowLock, r.locks, r.script.Round(time.Millisecond), r.pieces)
			out = append(out, r)
		}
	}
	return out, nil
}

func bigOne(ctx context.Context, b *bench, n int64, kill bool) (bigResult, error) {
	res := bigResult{keys: n, killed: kill}
	c, err := newSetUpCluster(ctx, int(n))
	if err != nil {
		return res, err
	}
	defer c.close()
	ropt, err := redisconn.Parse(c.redis.URL(), redisconn.TLSOptions{})
	if err != nil {
		return res, err
	}
	rdb := redisconn.New(ropt, nil)
	defer rdb.Close()
	if err := rdb.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err(); err != nil {
		return res, err
	}
	wc, err := startWalcount(b.bin, b.tmp, c, "--skip-check")
	if err != nil {
		return res, err
	}
	// wc is the walcount running: the one started after a SIGKILL.
	defer func() { _ = wc.stop() }()
	if err := wc.waitMetrics(ctx); err != nil {
		return res, err
	}
	if err := c.caughtUp(ctx, time.Minute); err != nil {
		return res, err
	}
	_ = rdb.SlowLogReset(ctx).Err()

	probes := startBigProbes(ctx, rdb, c, n)
	defer probes.stop()

	began := time.Now()
	if _, err := c.db.Exec(ctx, `INSERT INTO likes (post_id, user_id) SELECT g, 1 FROM generate_series(1, $1::bigint) g`, n); err != nil {
		return res, fmt.Errorf("bulk insert: %w", err)
	}
	committed := time.Now()
	res.insert = committed.Sub(began)
	if kill {
		next, err := killMidFlush(ctx, b, c, wc)
		if next != nil {
			wc = next
		}
		if err != nil {
			return res, err
		}
	}
	if res.exact, err = waitBigExact(ctx, c, wc, n, committed); err != nil {
		return res, err
	}
	probes.stop()
	res.ping, res.pings = probes.ping, probes.pings
	res.lock, res.locks, res.slowLock = probes.lock, probes.locks, probes.slowLock
	if err := bigFigures(ctx, c, wc, rdb, &res); err != nil {
		return res, err
	}
	return res, wc.stop()
}

// bigProbes are a PING, and an app's lock of a random post's row, each
// one after the other, until the batch is exact; the figures are theirs
// once stopped.
type bigProbes struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex

	ping, lock   time.Duration
	pings, locks int
	slowLock     int
}

func startBigProbes(ctx context.Context, rdb redis.UniversalClient, c *cluster, n int64) *bigProbes {
	pctx, cancel := context.WithCancel(ctx)
	p := &bigProbes{cancel: cancel}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		for pctx.Err() == nil {
			t := time.Now()
			if err := rdb.Ping(pctx).Err(); err == nil {
				d := time.Since(t)
				p.mu.Lock()
				p.ping, p.pings = max(p.ping, d), p.pings+1
				p.mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	go func() {
		defer p.wg.Done()
		for pctx.Err() == nil {
			// In a transaction rolled back: the time is the lock's
			// alone, not also a commit's wait for the WAL's flush to
			// disk (the lock is WAL-logged), which the flush's millions
			// of row updates make long for everyone, lock or none.
			id := 1 + rand.Int64N(n)
			tx, err := c.db.Begin(pctx)
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			t := time.Now()
			_, err = tx.Exec(pctx, `SELECT id FROM posts WHERE id = $1 FOR NO KEY UPDATE`, id)
			d := time.Since(t)
			_ = tx.Rollback(context.Background())
			if err == nil {
				p.mu.Lock()
				p.lock, p.locks = max(p.lock, d), p.locks+1
				if d > 500*time.Millisecond {
					p.slowLock++
				}
				p.mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return p
}

// stop ends the probes and waits for them; calling it again is harmless.
func (p *bigProbes) stop() {
	p.cancel()
	p.wg.Wait()
}

// killMidFlush SIGKILLs walcount once a few pieces of the batch are
// committed, then starts a new one, which it returns.
func killMidFlush(ctx context.Context, b *bench, c *cluster, wc *walcountProc) (*walcountProc, error) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if err := wc.alive(); err != nil {
			return nil, err
		}
		if fams, err := wc.scrape(ctx); err == nil && metricValue(fams, "walcount_flush_pieces_total") >= 3 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("walcount committed no 3 pieces within 10 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := wc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return nil, err
	}
	<-wc.done
	next, err := startWalcount(b.bin, b.tmp, c, "--skip-check")
	if err != nil {
		return nil, err
	}
	return next, next.waitMetrics(ctx)
}

// waitBigExact waits until the batch is exact, W past the insert and
// every carried key applied, and returns how long after its commit.
func waitBigExact(ctx context.Context, c *cluster, wc *walcountProc, n int64, committed time.Time) (time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	for {
		if err := wc.alive(); err != nil {
			return 0, err
		}
		var carried, sum int64
		err := c.db.QueryRow(wctx, `SELECT (SELECT count(*) FROM walcount.carried), (SELECT coalesce(sum(likes_count), 0) FROM posts)`).Scan(&carried, &sum)
		if err == nil && carried == 0 && sum == n {
			return time.Since(committed), nil
		}
		if wctx.Err() != nil {
			return 0, fmt.Errorf("not exact after 15 minutes (sum %d of %d, %d carried)", sum, n, carried)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bigFigures checks the counts once more and reads walcount's peak RSS
// (without a SIGKILL only), its pieces, and Redis's peak memory and
// longest script.
func bigFigures(ctx context.Context, c *cluster, wc *walcountProc, rdb redis.UniversalClient, res *bigResult) error {
	if err := c.verifySettled(ctx); err != nil {
		return err
	}
	if !res.killed {
		u, err := wc.usage()
		if err != nil {
			return err
		}
		res.rss = u.peakRSS
	}
	if fams, err := wc.scrape(ctx); err == nil {
		res.pieces = metricValue(fams, "walcount_flush_pieces_total")
	}
	var err error
	if res.redisPeak, err = redisMemoryPeak(ctx, rdb); err != nil {
		return err
	}
	res.script, err = longestScript(ctx, rdb)
	return err
}

// redisMemoryPeak reads used_memory_peak.
func redisMemoryPeak(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory_peak:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory_peak in INFO memory")
}

// longestScript returns the longest script call in the slow log (which
// keeps the calls over 10 ms).
func longestScript(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	logs, err := rdb.SlowLogGet(ctx, 128).Result()
	if err != nil {
		return 0, err
	}
	var longest time.Duration
	for _, l := range logs {
		if len(l.Args) > 0 && (strings.EqualFold(l.Args[0], "evalsha") || strings.EqualFold(l.Args[0], "eval")) {
			longest = max(longest, l.Duration)
		}
	}
	return longest, nil
}

func (r *results) bigSection(b *strings.Builder) {
	fmt.Fprintf(b, "## 11. One big batch\n\n")
	fmt.Fprintf(b, "N posts; one `INSERT INTO likes SELECT g, 1 FROM generate_series(1, N) g` while walcount runs (defaults: `flush_lock_time` 200ms). "+
		"Exact: from the insert's commit until every post equals COUNT(*). While it flushes, a Redis PING and an app's `SELECT … FOR NO KEY UPDATE` "+
		"of one random post (the lock its own UPDATE takes) run one after the other; the slow log keeps scripts over 10 ms.\n\n")
	fmt.Fprintf(b, "| keys | insert | exact after | walcount peak RSS | Redis used_memory_peak | longest PING | longest app row lock | locks over 500 ms | longest script | pieces |\n")
	fmt.Fprintf(b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, g := range r.big {
		keys := strconv.FormatInt(g.keys, 10)
		rss := fmt.Sprintf("%.0f MiB", float64(g.rss)/(1<<20))
		if g.killed {
			keys += ", SIGKILL mid-flush"
			rss = "n/a"
		}
		script := "none over 10 ms"
		if g.script > 0 {
			script = msec(g.script)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %.0f MiB | %s | %s | %d of %d | %s | %.0f |\n", keys, g.insert.Round(time.Millisecond), g.exact.Round(time.Millisecond),
			rss, float64(g.redisPeak)/(1<<20), msec(g.ping), msec(g.lock), g.slowLock, g.locks, script, g.pieces)
	}
	b.WriteString("\n")
}
