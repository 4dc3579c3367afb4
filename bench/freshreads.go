package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/events"
	"github.com/walcount/walcount/internal/stats"
)

// Section 13 (-only reads): fresh reads (docs/fresh-reads.md) of the hot
// post, paced at readsTarget reads/s, while freshClients paced clients
// like that post at readsLikeRate likes/s. Beside them a read-your-writes
// probe likes the post, takes pg_current_wal_lsn() and reads it with
// min_lsn, and a receive probe likes post 0 and times commit → the
// daemon's walcount_received_lsn past it: the stream's receive lag, which
// bounds the min_lsn wait from below. The receive probe's likes are also
// timed commit → their change event (docs/fresh-reads.md, "Change
// events"): the first entry of post 0 in the counter's stream whose value
// counts the like, read with XREAD BLOCK.
const (
	// readsTarget is the plain reads' rate, reads/s.
	readsTarget = 1000
	// readers issue the plain reads, each keeping to its slots of the
	// schedule.
	readers = 8
	// readsLikeRate is the writers' rate, likes/s on the hot post.
	readsLikeRate = 1000
	// rywInterval is how often the read-your-writes probe likes and reads.
	rywInterval = 20 * time.Millisecond
	// recvInterval is how often the receive probe likes post 0;
	// recvPoll how often it then reads the daemon's metrics.
	recvInterval = 50 * time.Millisecond
	recvPoll     = time.Millisecond
)

// freadsResult is section 13.
type freadsResult struct {
	target, achieved float64 // plain reads/s
	likes            float64 // the writers' likes/s
	// reads and ryw are the client's times of the plain and the min_lsn
	// reads in the window, sorted; recv the receive lags; events the lags
	// of the receive probe's likes to their change event.
	reads, ryw, recv, events []time.Duration
	// errors counts answers other than 200 and min_lsn answers below
	// their min_lsn.
	errors int64
	// waits and waitP50/waitP99 are walcount_fresh_read_wait_seconds over
	// the window, interpolated inside its buckets.
	waits            uint64
	waitP50, waitP99 float64
	// nudges are the heartbeats walcount emitted in the window for waits
	// that lasted past 20 ms (walcount_fresh_read_nudges_total).
	nudges float64
	exact  bool
}

// timing is one request: when it started and how long it took.
type timing struct {
	at  time.Time
	lat time.Duration
}

// recorder keeps timings and errors from several goroutines.
type recorder struct {
	mu     sync.Mutex
	t      []timing
	errors int64
}

func (r *recorder) add(at time.Time, lat time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t = append(r.t, timing{at, lat})
	if !ok {
		r.errors++
	}
}

// window returns the sorted times of the requests started in [from, to).
func (r *recorder) window(from, to time.Time) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for _, t := range r.t {
		if !t.at.Before(from) && t.at.Before(to) {
			out = append(out, t.lat)
		}
	}
	slices.Sort(out)
	return out
}

// freshClient reads the daemon's counters over kept-alive connections.
type freshClient struct {
	http *http.Client
	base string
}

// get reads post's post_likes (with minLSN unless empty) and says whether
// the answer is a 200 at or past minLSN.
func (f freshClient) get(ctx context.Context, post int64, minLSN string) bool {
	url := fmt.Sprintf("%s/v1/counters/post_likes/%d", f.base, post)
	if minLSN != "" {
		url += "?min_lsn=" + minLSN + "&timeout=5s"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var a struct {
		LSN string `json:"lsn"`
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		return false
	}
	if minLSN == "" {
		return true
	}
	got, err1 := pglogrepl.ParseLSN(a.LSN)
	want, err2 := pglogrepl.ParseLSN(minLSN)
	return err1 == nil && err2 == nil && got >= want
}

func runFreshReads(ctx context.Context, b *bench) (freadsResult, error) {
	res := freadsResult{target: readsTarget}
	c, err := newSetUpCluster(ctx, zipfPosts)
	if err != nil {
		return res, err
	}
	defer c.close()
	wc, err := startReady(ctx, b, c)
	if err != nil {
		return res, err
	}
	defer wc.stop()
	fc := freshClient{base: "http://" + wc.addr,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * readers}}}

	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var reads, ryw, recv recorder
	ev := &eventLags{}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	wg.Go(func() { _, errs[0] = pacedLoad(lctx, c.url, freshClients, readsLikeRate, workloads[0]) })
	wg.Go(func() { pacedReads(lctx, fc, &reads) })
	wg.Go(func() { errs[1] = rywProbe(lctx, c.url, fc, &ryw) })
	wg.Go(func() { errs[2] = recvProbe(lctx, c.url, wc, &recv, ev) })
	// The watcher outlives the load: the likes at the window's end are
	// counted by events up to a flush interval later.
	ectx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	var ewg sync.WaitGroup
	ewg.Go(func() { errs[3] = watchEvents(ectx, c.redis.URL(), ev) })

	if err := pause(ctx, b.freshWarmup); err != nil {
		return res, err
	}
	fams, err := wc.scrape(ctx)
	if err != nil {
		return res, err
	}
	wait0 := histogramOf(fams, "walcount_fresh_read_wait_seconds")
	nudges0 := metricValue(fams, "walcount_fresh_read_nudges_total")
	likes0, err := c.likesCount(ctx)
	if err != nil {
		return res, err
	}
	from := time.Now()
	if err := pause(ctx, b.freshMeasure); err != nil {
		return res, err
	}
	to := time.Now()
	likes1, err := c.likesCount(ctx)
	if err != nil {
		return res, err
	}
	// The reads that started in the window end within their timeout.
	time.Sleep(200 * time.Millisecond)
	if fams, err = wc.scrape(ctx); err != nil {
		return res, err
	}
	stopLoad()
	wg.Wait()
	ev.awaitCounted(ctx, from, to, 30*time.Second)
	stopEvents()
	ewg.Wait()
	for _, err := range errs {
		if err != nil && ctx.Err() == nil {
			return res, err
		}
	}

	window := to.Sub(from).Seconds()
	res.reads, res.ryw, res.recv = reads.window(from, to), ryw.window(from, to), recv.window(from, to)
	res.events = ev.window(from, to)
	res.achieved = float64(len(res.reads)) / window
	res.likes = float64(likes1-likes0) / window
	res.errors = reads.errors + ryw.errors
	win := subBuckets(histogramOf(fams, "walcount_fresh_read_wait_seconds"), wait0)
	if len(win) > 0 {
		res.waits = win[len(win)-1].Count
	}
	res.waitP50, res.waitP99 = histQuantile(0.5, win), histQuantile(0.99, win)
	res.nudges = metricValue(fams, "walcount_fresh_read_nudges_total") - nudges0

	if err := c.settled(ctx, 2*time.Minute); err != nil {
		return res, err
	}
	if err := wc.stop(); err != nil {
		return res, err
	}
	if err := c.verify(ctx); err != nil {
		return res, err
	}
	res.exact = true
	b.logf("  %.0f reads/s (target %d), %.0f likes/s: read p50 %s p99 %s; min_lsn read p50 %s p99 %s, wait p50 %s p99 %s (histogram), %.0f heartbeats; receive lag p50 %s p99 %s; change event lag p50 %s p99 %s (%d); %d errors",
		res.achieved, readsTarget, res.likes, msText(q(res.reads, 0.5)), msText(q(res.reads, 0.99)), msText(q(res.ryw, 0.5)), msText(q(res.ryw, 0.99)),
		waitMS(res.waitP50), waitMS(res.waitP99), res.nudges, msText(q(res.recv, 0.5)), msText(q(res.recv, 0.99)),
		msText(q(res.events, 0.5)), msText(q(res.events, 0.99)), len(res.events), res.errors)
	return res, nil
}

// histogramOf returns the cumulative buckets of an unlabelled histogram.
func histogramOf(fams map[string]*dto.MetricFamily, name string) []bucket {
	f := fams[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return nil
	}
	return histBuckets(f.GetMetric()[0].GetHistogram())
}

// pacedReads reads the hot post at readsTarget reads/s (open loop) with
// readers goroutines until ctx is done.
func pacedReads(ctx context.Context, fc freshClient, rec *recorder) {
	paced(ctx, readers, readsTarget, func(int) func() bool {
		return func() bool {
			at := time.Now()
			ok := fc.get(ctx, hotPost, "")
			if ctx.Err() == nil {
				rec.add(at, time.Since(at), ok)
			}
			return true
		}
	})
}

// rywProbe likes the hot post every rywInterval, takes the WAL position
// after the commit and times the read with that min_lsn.
func rywProbe(ctx context.Context, url string, fc freshClient, rec *recorder) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var user int64 = 1 << 40
	var werr error
	every(ctx, rywInterval, func() bool {
		user++
		if _, werr = conn.Exec(ctx, insertSQL, hotPost, user); werr != nil {
			return false
		}
		var lsn string
		if werr = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); werr != nil {
			return false
		}
		at := time.Now()
		ok := fc.get(ctx, hotPost, lsn)
		if ctx.Err() == nil {
			rec.add(at, time.Since(at), ok)
		}
		return true
	})
	if ctx.Err() != nil {
		return nil
	}
	return werr
}

// recvProbe likes post 0 every recvInterval and times commit → the
// daemon's walcount_received_lsn at or past the WAL position after it.
// Its likes are post 0's only: the n-th after its start is counted by an
// event whose value is at least the count before it plus n (ev).
func recvProbe(ctx context.Context, url string, wc *walcountProc, rec *recorder, ev *eventLags) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var count int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM likes WHERE post_id = $1", probePost).Scan(&count); err != nil {
		return err
	}
	var user int64 = 1 << 41
	var perr error
	every(ctx, recvInterval, func() bool {
		user++
		var lsn string
		if _, perr = conn.Exec(ctx, insertSQL, probePost, user); perr != nil {
			return false
		}
		at := time.Now()
		count++
		ev.committed(count, at)
		if perr = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); perr != nil {
			return false
		}
		want, err := pglogrepl.ParseLSN(lsn)
		if perr = err; err != nil {
			return false
		}
		for ctx.Err() == nil {
			fams, err := wc.scrape(ctx)
			if err == nil && pglogrepl.LSN(metricValue(fams, "walcount_received_lsn")) >= want {
				rec.add(at, time.Since(at), true)
				break
			}
			time.Sleep(recvPoll)
		}
		return true
	})
	if ctx.Err() != nil {
		return nil
	}
	return perr
}

// eventLags pairs the receive probe's commits with the change events of
// post 0: a commit of the n-th like and the first entry whose value is at
// least n.
type eventLags struct {
	mu       sync.Mutex
	commits  []eventAt // in commit order, n rising
	arrivals []eventAt // in arrival order
}

type eventAt struct {
	n  int64
	at time.Time
}

func (e *eventLags) committed(n int64, at time.Time) {
	e.mu.Lock()
	e.commits = append(e.commits, eventAt{n, at})
	e.mu.Unlock()
}

func (e *eventLags) arrived(n int64, at time.Time) {
	e.mu.Lock()
	e.arrivals = append(e.arrivals, eventAt{n, at})
	e.mu.Unlock()
}

// awaitCounted waits, at most within, until every commit in [from, to)
// has its event.
func (e *eventLags) awaitCounted(ctx context.Context, from, to time.Time, within time.Duration) {
	deadline := time.Now().Add(within)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		e.mu.Lock()
		var want, got int64
		for _, c := range e.commits {
			if !c.at.Before(from) && c.at.Before(to) {
				want = max(want, c.n)
			}
		}
		for _, a := range e.arrivals {
			got = max(got, a.n)
		}
		e.mu.Unlock()
		if got >= want {
			return
		}
		// Polling what the watcher records; it has no signal to wait on.
		time.Sleep(10 * time.Millisecond)
	}
}

// window returns, sorted, the lags of the commits in [from, to) that an
// event counted.
func (e *eventLags) window(from, to time.Time) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []time.Duration
	for _, c := range e.commits {
		if c.at.Before(from) || !c.at.Before(to) {
			continue
		}
		for _, a := range e.arrivals {
			if a.n >= c.n && !a.at.Before(c.at) {
				out = append(out, a.at.Sub(c.at))
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// watchEvents follows the change events of post_likes (XREAD BLOCK from
// the entries added after it starts) and records post 0's.
func watchEvents(ctx context.Context, redisURL string, ev *eventLags) error {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	stream := events.Stream(config.DefaultSlot, counter.Default().Name)
	last := "$"
	key := strconv.Itoa(probePost)
	for ctx.Err() == nil {
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Block: 100 * time.Millisecond, Count: 1000}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read the change events: %w", err)
		}
		now := time.Now()
		for _, st := range res {
			for _, m := range st.Messages {
				last = m.ID
				if m.Values["key"] != key {
					continue
				}
				v, _ := m.Values["value"].(string)
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					ev.arrived(n, now)
				}
			}
		}
	}
	return nil
}

func q(sorted []time.Duration, p float64) time.Duration { return stats.Quantile(sorted, p) }

// msText renders a duration in milliseconds to the hundredth.
func msText(d time.Duration) string { return fmt.Sprintf("%.2f ms", ms(d)) }

// freadsSection renders section 13.
func freadsSection(r freadsResult) string {
	var s strings.Builder
	fmt.Fprintf(&s, "## 13. Fresh reads\n\n`GET /v1/counters/post_likes/1` (the hot post) paced at %d reads/s by %d clients, while %d paced clients like that post at %d likes/s. "+
		"A read-your-writes probe likes the post every %s, takes `pg_current_wal_lsn()` and reads with that `min_lsn`; a receive probe likes post 0 every %s and times commit → `walcount_received_lsn` past it (the stream's receive lag), and its likes commit → the first change event of post 0 that counts them (`XREAD BLOCK`; docs/fresh-reads.md). "+
		"Client times over keep-alive connections; the wait is `walcount_fresh_read_wait_seconds`, interpolated inside its buckets; heartbeats are `walcount_fresh_read_nudges_total` (walcount emits one for a wait past 20 ms). Counts verified at the end.\n\n",
		readsTarget, readers, freshClients, readsLikeRate, rywInterval, recvInterval)
	s.WriteString("| reads/s: target / achieved | likes/s | read p50 | read p99 | min_lsn reads | min_lsn read p50 | min_lsn read p99 | wait p50 / p99 (histogram) | heartbeats | receive lag p50 | receive lag p99 | change event lag p50 | change event lag p99 | errors | exact |\n" +
		"|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n")
	fmt.Fprintf(&s, "| %s / %s | %s | %s | %s | %d (%d waits) | %s | %s | %s / %s | %.0f | %s | %s | %s | %s | %d | %s |\n\n",
		thousands(r.target), thousands(r.achieved), thousands(r.likes), msText(q(r.reads, 0.5)), msText(q(r.reads, 0.99)),
		len(r.ryw), r.waits, msText(q(r.ryw, 0.5)), msText(q(r.ryw, 0.99)), waitMS(r.waitP50), waitMS(r.waitP99), r.nudges, msText(q(r.recv, 0.5)), msText(q(r.recv, 0.99)),
		msText(q(r.events, 0.5)), msText(q(r.events, 0.99)), r.errors, map[bool]string{true: "yes", false: "no"}[r.exact])
	return s.String()
}

// waitMS renders a histogram quantile in seconds as milliseconds.
func waitMS(sec float64) string {
	if sec != sec { // NaN: no wait in the window
		return "–"
	}
	return msText(time.Duration(sec * float64(time.Second)))
}
