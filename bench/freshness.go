package main

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/stats"
)

// Freshness run.
const (
	// freshClients write the paced load.
	freshClients = 16
	// probeInterval is how often the probe likes post 0.
	probeInterval = 100 * time.Millisecond
	// probePoll is how often the probe reads post 0's likes_count.
	probePoll = 5 * time.Millisecond
	// probePost is the probe's post, outside the workload's posts.
	probePost = 0
)

// freshResult is section 3, with the write amplification (section 4) and
// the daemon cost (section 5) of the same run.
type freshResult struct {
	target, achieved float64 // likes/s
	// lagP50 and lagP99 come from walcount_apply_lag_seconds over the
	// measurement window, interpolated inside its buckets.
	lagP50, lagP99 float64
	// lagBucketP99 is the upper bound of the bucket holding the p99.
	lagBucketP99 float64
	// probes measure commit → likes_count visible, from outside.
	probes  []time.Duration // sorted
	likes   int64           // rows written during the window
	updates int64           // n_tup_upd of posts over the whole run
	total   int64           // likes over the whole run
	// flushes and deltas are walcount_flushes_total and
	// walcount_deltas_flushed_total over the whole run.
	flushes, deltas float64
	cpu             time.Duration // walcount's CPU during the window
	peakRSS         int64
	exact           bool
}

// probe returns the q-quantile of the probes' delays; probes is sorted.
func (r freshResult) probe(q float64) time.Duration { return stats.Quantile(r.probes, q) }

// usageAndLikes reads walcount's CPU and memory and the likes counted.
func usageAndLikes(ctx context.Context, wc *walcountProc, c *cluster) (usage, int64, error) {
	u, err := wc.usage()
	if err != nil {
		return u, 0, err
	}
	likes, err := c.likesCount(ctx)
	return u, likes, err
}

// runFreshness measures apply lag at a fixed rate on a fresh cluster.
func runFreshness(ctx context.Context, b *bench, rate float64) (freshResult, error) {
	res := freshResult{target: rate}
	c, err := newSetUpCluster(ctx, zipfPosts)
	if err != nil {
		return res, err
	}
	defer c.close()
	updates0, err := c.postUpdates(ctx)
	if err != nil {
		return res, err
	}
	wc, err := startReady(ctx, b, c)
	if err != nil {
		return res, err
	}
	defer wc.stop()

	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var loadErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		_, loadErr = pacedLoad(lctx, c.url, freshClients, rate, workloads[1])
	})
	pr := &prober{c: c}
	wg.Go(func() { pr.run(lctx) })

	if err := pause(ctx, b.freshWarmup); err != nil {
		return res, err
	}
	fams, err := wc.scrape(ctx)
	if err != nil {
		return res, err
	}
	lag0 := lagBuckets(fams)
	u0, likes0, err := usageAndLikes(ctx, wc, c)
	if err != nil {
		return res, err
	}
	pr.setWindow(time.Now())
	windowStart := time.Now()
	if err := pause(ctx, b.freshMeasure); err != nil {
		return res, err
	}
	pr.setWindowEnd(time.Now())
	window := time.Since(windowStart)
	u1, likes1, err := usageAndLikes(ctx, wc, c)
	if err != nil {
		return res, err
	}
	// The quantiles come after a last flush, so the window's last
	// transactions are in the histogram.
	time.Sleep(2 * config.DefaultFlushInterval)
	fams, err = wc.scrape(ctx)
	if err != nil {
		return res, err
	}
	stopLoad()
	wg.Wait()
	if loadErr != nil {
		return res, loadErr
	}

	win := subBuckets(lagBuckets(fams), lag0)
	res.lagP50, res.lagP99 = histQuantile(0.5, win), histQuantile(0.99, win)
	res.lagBucketP99 = bucketBound(0.99, win)
	res.probes = pr.lags()
	res.likes = likes1 - likes0
	res.achieved = float64(res.likes) / window.Seconds()
	res.cpu = u1.cpu - u0.cpu
	res.peakRSS = u1.peakRSS

	err = freshTotals(ctx, b, c, wc, &res, updates0)
	return res, err
}

// freshTotals, once the load stopped and the run caught up, reads the
// flushes and deltas, stops walcount, verifies the counts and counts the
// UPDATEs on posts and the likes; then it logs the run.
func freshTotals(ctx context.Context, b *bench, c *cluster, wc *walcountProc, res *freshResult, updates0 int64) error {
	// Settled, not only caught up: walcount stops next, and keys carried
	// to a next flush would stay off.
	if err := c.settled(ctx, 2*time.Minute); err != nil {
		return err
	}
	fams, err := wc.scrape(ctx)
	if err != nil {
		return err
	}
	res.flushes = metricValue(fams, "walcount_flushes_total")
	res.deltas = metricValue(fams, "walcount_deltas_flushed_total")
	if err := wc.stop(); err != nil {
		return err
	}
	if err := c.verify(ctx); err != nil {
		return err
	}
	res.exact = true
	time.Sleep(500 * time.Millisecond)
	updates1, err := c.postUpdates(ctx)
	if err != nil {
		return err
	}
	res.updates = updates1 - updates0
	if res.total, err = c.likesCount(ctx); err != nil {
		return err
	}
	b.logf("  target %.0f likes/s, achieved %.0f: apply lag p50 %.3fs p99 %.3fs (histogram, p99 bucket ≤ %gs); probe p50 %s p99 %s (%d probes); %.1f UPDATEs on posts per 100k likes",
		res.target, res.achieved, res.lagP50, res.lagP99, res.lagBucketP99, res.probe(0.5), res.probe(0.99), len(res.probes),
		float64(res.updates)/float64(res.total)*1e5)
	return nil
}

// bucketBound returns the upper bound of the bucket that holds the
// q-quantile.
func bucketBound(q float64, buckets []bucket) float64 {
	if len(buckets) == 0 {
		return 0
	}
	rank := q * float64(buckets[len(buckets)-1].Count)
	for _, b := range buckets {
		if float64(b.Count) >= rank {
			return b.UpperBound
		}
	}
	return buckets[len(buckets)-1].UpperBound
}

// prober likes post 0 every probeInterval and watches its likes_count:
// the time from a probe's commit until likes_count includes it is the
// freshness an app reading the counter sees.
type prober struct {
	c *cluster
	// insert and read, when set, replace the like of post 0 ($1, by user
	// $2) and the read of its likes_count ($1): another schema's probe.
	insert, read string

	mu        sync.Mutex
	committed []time.Time // commit time of the probe that made the count i+1
	from, to  time.Time   // the measurement window
	lag       []time.Duration
}

func (p *prober) setWindow(t time.Time) {
	p.mu.Lock()
	p.from = t
	p.mu.Unlock()
}

func (p *prober) setWindowEnd(t time.Time) {
	p.mu.Lock()
	p.to = t
	p.mu.Unlock()
}

func (p *prober) lags() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Clone(p.lag)
	slices.Sort(out)
	return out
}

func (p *prober) run(ctx context.Context) {
	insert, read := insertSQL, `SELECT likes_count FROM posts WHERE id = $1`
	if p.insert != "" {
		insert, read = p.insert, p.read
	}
	// The count before the first probe: a probe counts from there.
	var base int64
	if err := p.c.db.QueryRow(ctx, read, probePost).Scan(&base); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		every(ctx, probeInterval, func() bool {
			if _, err := p.c.db.Exec(ctx, insert, probePost, 0); err != nil {
				return false
			}
			now := time.Now()
			p.mu.Lock()
			p.committed = append(p.committed, now)
			p.mu.Unlock()
			return true
		})
	})
	wg.Go(func() {
		seen := int64(0)
		every(ctx, probePoll, func() bool {
			var n int64
			if err := p.c.db.QueryRow(ctx, read, probePost).Scan(&n); err != nil {
				return false
			}
			now := time.Now()
			p.mu.Lock()
			for ; seen < n-base && seen < int64(len(p.committed)); seen++ {
				at := p.committed[seen]
				if !p.from.IsZero() && !at.Before(p.from) && (p.to.IsZero() || at.Before(p.to)) {
					p.lag = append(p.lag, now.Sub(at))
				}
			}
			p.mu.Unlock()
			return true
		})
	})
	wg.Wait()
}

// every calls fn every interval, the first time one interval from now,
// until ctx is done or fn returns false.
func every(ctx context.Context, interval time.Duration, fn func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !fn() {
			return
		}
	}
}
