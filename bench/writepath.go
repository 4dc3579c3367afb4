package main

import (
	"context"
	"fmt"
	"time"

	"github.com/walcount/walcount/app/config"
)

// appConfig is one way of keeping likes_count, as the app sees it.
type appConfig struct {
	key   string // a, b, c, d
	name  string
	style style
	// walcount runs the daemon (and so has a slot and a walsender).
	walcount bool
	// recvlogical runs pg_recvlogical on the same slot and publication
	// instead: the cost of any pgoutput reader, with nothing counted.
	recvlogical bool
	trigger     bool
	// counts says whether likes_count is maintained (and verified).
	counts bool
}

var appConfigs = []appConfig{
	{key: "a", name: "insert only, no slot", style: styleInsert},
	{key: "b", name: "insert + walcount", style: styleInsert, walcount: true, counts: true},
	{key: "c", name: "counter_cache (INSERT + UPDATE in one txn)", style: styleCounterCache, counts: true},
	{key: "d", name: "AFTER INSERT trigger", style: styleInsert, trigger: true, counts: true},
	{key: "e", name: "insert + pg_recvlogical (reference reader)", style: styleInsert, recvlogical: true},
}

// writeCell is one closed-loop measurement.
type writeCell struct {
	config   string
	workload string
	clients  int
	res      runResult
}

// writeTotals is one configuration and workload over all client counts.
type writeTotals struct {
	config   string
	workload string
	likes    int64         // rows in likes at the end
	updates  int64         // n_tup_upd of posts
	cost     usage         // the slot's reader's: walcount for b, pg_recvlogical for e
	sender   time.Duration // CPU time of the walsender serving b or e
	redis    time.Duration // CPU time of Redis, for b
	exact    bool
}

type writeResults struct {
	cells  []writeCell
	totals []writeTotals
}

func (r *writeResults) cell(config, workload string, clients int) (writeCell, bool) {
	for _, c := range r.cells {
		if c.config == config && c.workload == workload && c.clients == clients {
			return c, true
		}
	}
	return writeCell{}, false
}

func (r *writeResults) total(config, workload string) (writeTotals, bool) {
	for _, t := range r.totals {
		if t.config == config && t.workload == workload {
			return t, true
		}
	}
	return writeTotals{}, false
}

// runWritePath measures section 1. Per workload, the four
// configurations each get a fresh cluster, all running at once; for each
// client count the bench runs b.rounds rounds of a, b, c and d in rotated
// order and pools them, so that noise that comes and goes on the machine
// (other processes, the disk) falls on every configuration alike.
func runWritePath(ctx context.Context, b *bench) (*writeResults, error) {
	out := &writeResults{}
	for _, w := range workloads {
		if err := runWriteWorkload(ctx, b, w, out); err != nil {
			return nil, fmt.Errorf("write path, %s: %w", w.name, err)
		}
	}
	return out, nil
}

// writeTarget is one configuration's cluster during section 1.
type writeTarget struct {
	cfg appConfig
	c   *cluster
	wc  *walcountProc    // for b
	rl  *recvlogicalProc // for e
}

func runWriteWorkload(ctx context.Context, b *bench, w workload, out *writeResults) error {
	targets := make([]*writeTarget, 0, len(appConfigs))
	defer func() {
		for _, t := range targets {
			if t.wc != nil {
				_ = t.wc.stop()
			}
			if t.rl != nil {
				_ = t.rl.stop()
			}
			t.c.close()
		}
	}()
	for _, cfg := range appConfigs {
		c, err := newCluster(ctx, zipfPosts)
		if err != nil {
			return err
		}
		t := &writeTarget{cfg: cfg, c: c}
		targets = append(targets, t)
		if err := t.prepare(ctx, b); err != nil {
			return fmt.Errorf("(%s): %w", cfg.key, err)
		}
	}
	for _, n := range b.clientCounts {
		pooled := make([]runResult, len(targets))
		for round := range b.rounds {
			for i := range targets {
				k := (i + round) % len(targets)
				t := targets[k]
				res, err := closedLoop(ctx, t.c.url, n, w, t.cfg.style, b.warmup, b.measure)
				if err != nil {
					return fmt.Errorf("(%s) %d clients: %w", t.cfg.key, n, err)
				}
				pooled[k] = pooled[k].merge(res)
				// The next step starts without a backlog.
				if t.wc != nil {
					if err := t.c.caughtUp(ctx, 2*time.Minute); err != nil {
						return fmt.Errorf("(b) catch up: %w; walcount: %v", err, t.wc.alive())
					}
				}
				if t.rl != nil {
					if err := t.c.sentPast(ctx, 2*time.Minute); err != nil {
						return fmt.Errorf("(e) catch up: %w; pg_recvlogical: %v", err, t.rl.alive())
					}
				}
			}
		}
		for k, t := range targets {
			res := pooled[k]
			out.cells = append(out.cells, writeCell{config: t.cfg.key, workload: w.name, clients: n, res: res})
			b.logf("  (%s) %-44s %-20s %2d clients: %8.0f likes/s  p50 %6.2f ms  p99 %6.2f ms%s",
				t.cfg.key, t.cfg.name, w.name, n, res.tps(), ms(res.quantile(0.5)), ms(res.quantile(0.99)), errNote(res.errors))
		}
	}
	for _, t := range targets {
		tot, err := t.finish(ctx)
		tot.workload = w.name
		if err != nil {
			return fmt.Errorf("(%s): %w", t.cfg.key, err)
		}
		out.totals = append(out.totals, tot)
	}
	return nil
}

// prepare installs the configuration: the trigger for d, setup and a
// running walcount for b, setup and a running pg_recvlogical for e.
func (t *writeTarget) prepare(ctx context.Context, b *bench) error {
	if t.cfg.trigger {
		if _, err := t.c.db.Exec(ctx, triggerSQL); err != nil {
			return fmt.Errorf("create trigger: %w", err)
		}
	}
	if !t.cfg.walcount && !t.cfg.recvlogical {
		return nil
	}
	if err := t.c.setup(ctx); err != nil {
		return fmt.Errorf("walcount setup: %w", err)
	}
	if t.cfg.recvlogical {
		rl, err := startRecvlogical(b.tmp, t.c)
		if err != nil {
			return err
		}
		t.rl = rl
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return rl.waitStreaming(sctx, t.c)
	}
	wc, err := startWalcount(b.bin, b.tmp, t.c)
	if err != nil {
		return err
	}
	t.wc = wc
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return wc.waitMetrics(sctx)
}

// finish stops walcount, verifies the counts and reads the statistics.
func (t *writeTarget) finish(ctx context.Context) (writeTotals, error) {
	tot := writeTotals{config: t.cfg.key}
	var err error
	if t.wc != nil || t.rl != nil {
		if tot.sender, err = t.c.senderCPU(ctx, config.DefaultSlot); err != nil {
			return tot, err
		}
	}
	if t.rl != nil {
		if tot.cost, err = t.rl.usage(); err != nil {
			return tot, err
		}
		err = t.rl.stop()
		t.rl = nil
		if err != nil {
			return tot, err
		}
	}
	if t.wc != nil {
		if tot.cost, err = t.wc.usage(); err != nil {
			return tot, err
		}
		ru, err := procUsage(t.c.redis.PID())
		if err != nil {
			return tot, fmt.Errorf("redis usage: %w", err)
		}
		tot.redis = ru.cpu
		err = t.wc.stop()
		t.wc = nil
		if err != nil {
			return tot, err
		}
	}
	if t.cfg.counts {
		if err := t.c.verify(ctx); err != nil {
			return tot, err
		}
		tot.exact = true
	}
	// Every writer has disconnected; give the exiting backends a moment
	// to report their table statistics.
	time.Sleep(500 * time.Millisecond)
	if tot.updates, err = t.c.postUpdates(ctx); err != nil {
		return tot, err
	}
	if tot.likes, err = t.c.likesCount(ctx); err != nil {
		return tot, err
	}
	return tot, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func errNote(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("  (%d errors)", n)
}
