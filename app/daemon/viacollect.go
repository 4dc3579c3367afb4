package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
)

// DefaultViaCollectInterval is how often the via tables are rid of the
// rows of deleted parents (Options.ViaCollectInterval).
const DefaultViaCollectInterval = 5 * time.Minute

// viaCollectBatch is how many via rows one transaction of a collection
// deletes; viaCollectTimeout bounds each.
const (
	viaCollectBatch   = 1000
	viaCollectTimeout = 30 * time.Second
)

// collectVia deletes, every ViaCollectInterval while this daemon streams,
// the via rows that hold nothing any more (CollectVia). Only the daemon
// that holds the slot collects: its own aggregator meets the deletes in the
// stream.
func (d *Daemon) collectVia(ctx context.Context) {
	if len(d.viaCounters()) == 0 {
		return
	}
	_ = everyTick(ctx, d.opt.ViaCollectInterval, func() error {
		if !d.streaming() {
			return nil
		}
		if _, err := d.CollectVia(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("cannot collect the via rows of deleted parents; trying again later", zap.Error(err))
		}
		return nil
	})
}

// viaCounters returns the total counter of each via table: the one that
// names both the source and the parent (counter.ViaCollectSQL).
func (d *Daemon) viaCounters() []counter.Counter {
	var out []counter.Counter
	for _, c := range d.cfg.Counters {
		if c.IsVia() && c.Through.Role == counter.RoleTotal {
			out = append(out, c)
		}
	}
	return out
}

// CollectVia deletes the via rows of deleted parents that no source row
// references any more, all zeros (counter.ViaCollectSQL), in transactions
// of up to viaCollectBatch rows, and returns how many it deleted. Without
// it a via table keeps a row for every parent ever deleted. It is exact
// alongside the flushes and the stream: it never waits for a row another
// transaction holds, deletes a row only while it is all zeros, and the
// deltas on their way for a deleted row's key create it again.
func (d *Daemon) CollectVia(ctx context.Context) (int64, error) {
	var total int64
	for _, c := range d.viaCounters() {
		n, err := d.collectViaTable(ctx, c)
		total += n
		if n > 0 {
			d.m.ViaRowsCollected.WithLabelValues(c.Through.Counter).Add(float64(n))
			d.log.Info("via rows of deleted parents collected", zap.String("counter", c.Through.Counter),
				zap.String("table", counter.ViaTable(c.Through.Counter)), zap.Int64("rows", n))
		}
		if err != nil {
			return total, fmt.Errorf("collect %s: %w", counter.ViaTable(c.Through.Counter), err)
		}
	}
	return total, nil
}

func (d *Daemon) collectViaTable(ctx context.Context, c counter.Counter) (int64, error) {
	q := counter.ViaCollectSQL(c)
	var total int64
	for {
		var n int
		bctx, cancel := context.WithTimeout(ctx, viaCollectTimeout)
		err := pgx.BeginFunc(bctx, d.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(bctx, q, viaCollectBatch)
			if err != nil {
				return err
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			n = len(keys)
			if n > 0 {
				d.log.Debug("via rows collected", zap.String("counter", c.Through.Counter), zap.Strings("keys", keys))
			}
			return d.opt.Failpoints.Inject(failpoint.ViaCollect)
		})
		cancel()
		if err != nil {
			return total, err
		}
		total += int64(n)
		if n < viaCollectBatch {
			return total, nil
		}
	}
}
