package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/metrics"
)

// drainShape is how the backlog's likes are grouped into transactions.
type drainShape struct {
	name    string
	rowsPer int
}

var drainShapes = []drainShape{{name: "1000-row transactions", rowsPer: 1000}, {name: "1-row transactions", rowsPer: 1}}

// drainResult is one shape's drain.
type drainResult struct {
	shape    drainShape
	likes    int64
	walBytes int64
	build    time.Duration
	bare     bareResult
	// received is when walcount_received_lsn reached the end, done when W
	// passed it; both from the start of the process.
	received, done time.Duration
	cost           usage // zero when the daemon ran in-process (-profile)
	profile        string
	// sender is the CPU time of the walsender that served walcount.
	sender time.Duration
	// txns is the number of transactions in the backlog; scripts the
	// Redis script calls walcount made to drain it (buffer writes and
	// flush hand-overs).
	txns, scripts int64
}

func (r drainResult) bareRate() float64 { return float64(r.likes) / r.bare.elapsed.Seconds() }
func (r drainResult) rate() float64     { return float64(r.likes) / r.done.Seconds() }

// runDrain measures section 2 for every shape, each on a fresh cluster.
func runDrain(ctx context.Context, b *bench) ([]drainResult, error) {
	var out []drainResult
	for _, s := range drainShapes {
		r, err := drainOne(ctx, b, s)
		if err != nil {
			return nil, fmt.Errorf("drain, %s: %w", s.name, err)
		}
		out = append(out, r)
		b.logf("  %-22s %d likes, %.0f MiB of WAL (built in %s): bare reader %s (%.0f likes/s); walcount received %s, W past the end %s (%.0f likes/s, %.2f× bare); %d redis script calls",
			s.name, r.likes, float64(r.walBytes)/(1<<20), r.build.Round(time.Millisecond),
			r.bare.elapsed.Round(time.Millisecond), r.bareRate(), r.received.Round(time.Millisecond),
			r.done.Round(time.Millisecond), r.rate(), r.rate()/r.bareRate(), r.scripts)
	}
	return out, nil
}

func drainOne(ctx context.Context, b *bench, s drainShape) (drainResult, error) {
	res := drainResult{shape: s}
	c, err := newSetUpCluster(ctx, zipfPosts)
	if err != nil {
		return res, err
	}
	defer c.close()
	cfg := c.walcountConfig()
	if _, err := c.db.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, bareSlot); err != nil {
		return res, fmt.Errorf("create bare slot: %w", err)
	}
	if _, err := c.db.Exec(ctx, backlogSQL); err != nil {
		return res, fmt.Errorf("create backlog procedure: %w", err)
	}

	// The backlog: built while walcount is stopped, by two sessions in
	// parallel. The build is not measured, so commits are asynchronous.
	var startLSN cdc.LSN
	if err := c.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&startLSN); err != nil {
		return res, err
	}
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	txns := int(b.backlog) / s.rowsPer
	for part := range 2 {
		n := txns / 2
		if part == 1 {
			n = txns - txns/2
		}
		g.Go(func() error {
			conn, err := c.db.Acquire(gctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(gctx, `SET synchronous_commit = off`); err != nil {
				return err
			}
			_, err = conn.Exec(gctx, fmt.Sprintf(`CALL bench_backlog(%d, %d, %d)`, n, s.rowsPer, zipfPosts))
			if err != nil {
				return fmt.Errorf("build backlog: %w", err)
			}
			_, err = conn.Exec(gctx, `RESET synchronous_commit`)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	res.build = time.Since(began)
	end, err := c.mark(ctx)
	if err != nil {
		return res, err
	}
	res.walBytes = int64(end - startLSN)
	if res.likes, err = c.likesCount(ctx); err != nil {
		return res, err
	}
	// Start both readers from the same quiet state.
	if _, err := c.db.Exec(ctx, `CHECKPOINT`); err != nil {
		return res, err
	}

	if res.bare, err = bareDrain(ctx, c.url, cfg.Publication, end); err != nil {
		return res, fmt.Errorf("bare reader: %w", err)
	}
	if res.bare.inserts != res.likes {
		return res, fmt.Errorf("bare reader decoded %d inserts, want %d", res.bare.inserts, res.likes)
	}

	if b.profileDir != "" {
		err = drainInProcess(ctx, b, c, s, end, &res)
	} else {
		err = drainSubprocess(ctx, b, c, end, &res)
	}
	if err != nil {
		return res, err
	}
	res.txns = int64(txns)
	if res.scripts, err = c.redisScriptCalls(ctx); err != nil {
		return res, err
	}
	return res, c.verify(ctx)
}

// drainSubprocess times `walcount run` from its start until W passes end.
func drainSubprocess(ctx context.Context, b *bench, c *cluster, end cdc.LSN, res *drainResult) error {
	wc, err := startWalcount(b.bin, b.tmp, c, "--skip-check")
	if err != nil {
		return err
	}
	defer wc.stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	var lastScrape time.Time
	for {
		if err := wc.alive(); err != nil {
			return err
		}
		now := time.Now()
		if res.received == 0 && now.Sub(lastScrape) >= 50*time.Millisecond {
			lastScrape = now
			if fams, err := wc.scrape(ctx); err == nil && cdc.LSN(metricValue(fams, "walcount_received_lsn")) >= end {
				res.received = time.Since(wc.started)
			}
		}
		if w, err := c.checkpoint(ctx); err == nil && w > end {
			res.done = time.Since(wc.started)
			if res.received == 0 {
				res.received = res.done
			}
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("walcount did not drain: %w", ctx.Err())
		case <-poll.C:
		}
	}
	if res.cost, err = wc.usage(); err != nil {
		return err
	}
	if res.sender, err = c.senderCPU(ctx, config.DefaultSlot); err != nil {
		return err
	}
	return wc.stop()
}

// drainInProcess runs the daemon inside this process under the CPU
// profiler: the profile shows where walcount's time goes during a drain.
func drainInProcess(ctx context.Context, b *bench, c *cluster, s drainShape, end cdc.LSN, res *drainResult) error {
	name := "drain-" + strings.NewReplacer(" ", "-", "_", "-").Replace(s.name) + ".pprof"
	res.profile = filepath.Join(b.profileDir, name)
	f, err := os.Create(res.profile)
	if err != nil {
		return err
	}
	defer f.Close()
	m := metrics.New()
	d, err := daemon.New(daemon.Options{Config: c.walcountConfig(), Metrics: m, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer d.Close()
	dctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	started := time.Now()
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for res.done == 0 {
		if res.received == 0 && cdc.LSN(gaugeOf(m.ReceivedLSN)) >= end {
			res.received = time.Since(started)
		}
		if w, err := c.checkpoint(ctx); err == nil && w > end {
			res.done = time.Since(started)
			if res.sender, err = c.senderCPU(ctx, config.DefaultSlot); err != nil {
				pprof.StopCPUProfile()
				return err
			}
		}
		select {
		case err := <-done:
			pprof.StopCPUProfile()
			return fmt.Errorf("daemon stopped: %v", err)
		case <-poll.C:
		}
	}
	pprof.StopCPUProfile()
	stop()
	return <-done
}
