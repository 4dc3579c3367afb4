package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/walcount/walcount/internal/stats"
)

// Workloads: which post a like goes to.
const (
	// zipfS is the Zipf exponent over the posts: with 10k posts the top
	// post gets about 15% of all likes, the top 10 about 45%.
	zipfS = 1.1
	// zipfPosts is the number of posts of the Zipf workload.
	zipfPosts = 10_000
	// hotPost is the only post of the hot workload.
	hotPost = 1
)

// workload picks posts.
type workload struct {
	name string
	hot  bool
	// uniform, when set, draws posts uniformly from 1..uniform.
	uniform int64
}

var workloads = []workload{{name: "hot post", hot: true}, {name: "Zipf over 10k posts"}}

// picker returns a post chooser for one client.
func (w workload) picker(seed uint64) func() int64 {
	if w.hot {
		return func() int64 { return hotPost }
	}
	rng := rand.New(rand.NewPCG(seed, 0xbe7c4))
	if w.uniform > 0 {
		return func() int64 { return 1 + rng.Int64N(w.uniform) }
	}
	z := rand.NewZipf(rng, zipfS, 1, zipfPosts-1)
	return func() int64 { return int64(z.Uint64()) + 1 }
}

// style is how the app writes a like.
type style int

const (
	// styleInsert is one INSERT in its own transaction (configurations a,
	// b and d: the trigger fires inside it).
	styleInsert style = iota
	// styleCounterCache is Rails' counter_cache: INSERT and
	// UPDATE posts SET likes_count = likes_count + 1 in one transaction.
	styleCounterCache
)

const (
	insertSQL = `INSERT INTO likes (post_id, user_id) VALUES ($1, $2)`
	bumpSQL   = `UPDATE posts SET likes_count = likes_count + 1 WHERE id = $1`
)

// runResult is what a closed-loop run measured.
type runResult struct {
	txns      int64
	elapsed   time.Duration
	latencies []time.Duration // sorted
	errors    int64
}

// merge pools two runs of the same configuration.
func (r runResult) merge(o runResult) runResult {
	out := runResult{
		txns:      r.txns + o.txns,
		elapsed:   r.elapsed + o.elapsed,
		latencies: append(slices.Clone(r.latencies), o.latencies...),
		errors:    r.errors + o.errors,
	}
	slices.Sort(out.latencies)
	return out
}

func (r runResult) tps() float64 { return float64(r.txns) / r.elapsed.Seconds() }

// quantile returns the q-quantile of the latencies, which are sorted.
func (r runResult) quantile(q float64) time.Duration { return stats.Quantile(r.latencies, q) }

// connectAll opens n connections to url; closeAll closes them. On an error
// the ones opened are closed.
func connectAll(ctx context.Context, url string, n int) (conns []*pgx.Conn, closeAll func(), err error) {
	conns = make([]*pgx.Conn, n)
	closeAll = func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}
	for i := range conns {
		if conns[i], err = pgx.Connect(ctx, url); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	return conns, closeAll, nil
}

// closedLoop runs clients that each write likes back to back for
// warmup+measure; what completes inside the measurement window counts.
func closedLoop(ctx context.Context, url string, clients int, w workload, st style, warmup, measure time.Duration) (runResult, error) {
	conns, closeAll, err := connectAll(ctx, url, clients)
	if err != nil {
		return runResult{}, err
	}
	defer closeAll()
	begin := time.Now()
	from, until := begin.Add(warmup), begin.Add(warmup+measure)
	type clientResult struct {
		lat  []time.Duration
		errs int64
		err  error
	}
	results := make([]clientResult, clients)
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() {
			r := &results[i]
			r.lat = make([]time.Duration, 0, 1<<14)
			pick := w.picker(uint64(i) + 1)
			user := int64(i) << 32
			for {
				start := time.Now()
				if !start.Before(until) {
					return
				}
				user++
				err := writeLike(ctx, conn, st, pick(), user)
				end := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						r.err = ctx.Err()
						return
					}
					r.errs++
					continue
				}
				if !start.Before(from) && !end.After(until) {
					r.lat = append(r.lat, end.Sub(start))
				}
			}
		})
	}
	wg.Wait()
	var out runResult
	for _, r := range results {
		if r.err != nil {
			return out, r.err
		}
		out.latencies = append(out.latencies, r.lat...)
		out.errors += r.errs
	}
	slices.Sort(out.latencies)
	out.txns = int64(len(out.latencies))
	out.elapsed = measure
	return out, nil
}

// writeLike writes one like in the given style.
func writeLike(ctx context.Context, conn *pgx.Conn, st style, post, user int64) error {
	switch st {
	case styleCounterCache:
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertSQL, post, user); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if _, err := tx.Exec(ctx, bumpSQL, post); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	default:
		_, err := conn.Exec(ctx, insertSQL, post, user)
		return err
	}
}

// paced calls the step functions of n workers at rate calls/s in all (an
// open loop) until ctx is done or a step returns false: worker i makes
// its step function once, calls it first at i/rate after the start, then
// every n/rate, and back to back when it falls behind.
func paced(ctx context.Context, n int, rate float64, worker func(i int) (step func() bool)) {
	start := time.Now()
	interval := time.Duration(float64(time.Second) * float64(n) / rate)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			step := worker(i)
			next := start.Add(time.Duration(float64(time.Second) * float64(i) / rate))
			for {
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				if ctx.Err() != nil || !step() {
					return
				}
				next = next.Add(interval)
			}
		})
	}
	wg.Wait()
}

// pacedLoad writes likes at a fixed rate (open loop) with the given
// clients until ctx is done; each client keeps to its slots of the
// schedule and runs back to back when it falls behind. It returns the
// likes written.
func pacedLoad(ctx context.Context, url string, clients int, rate float64, w workload) (int64, error) {
	conns := make([]*pgx.Conn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return 0, err
		}
		conns[i] = c
	}
	counts := make([]int64, clients)
	errs := make([]error, clients)
	paced(ctx, clients, rate, func(i int) func() bool {
		pick := w.picker(uint64(i) + 101)
		user := int64(i) << 32
		return func() bool {
			user++
			if _, err := conns[i].Exec(context.WithoutCancel(ctx), insertSQL, pick(), user); err != nil {
				errs[i] = fmt.Errorf("paced insert: %w", err)
				return false
			}
			counts[i]++
			return true
		}
	})
	var n int64
	for i := range counts {
		if errs[i] != nil {
			return n, errs[i]
		}
		n += counts[i]
	}
	return n, nil
}
