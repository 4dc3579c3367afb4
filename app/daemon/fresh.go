package daemon

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/fresh"
	"github.com/walcount/walcount/internal/metrics"
)

// freshReadConns is how many PostgreSQL connections fresh reads may use
// at once.
const freshReadConns = 4

// newFreshReader makes the fresh reads' pool, a copy of the daemon's
// settings with a few connections of its own, and their reader.
func (d *Daemon) newFreshReader(pcfg *pgxpool.Config) error {
	rcfg := pcfg.Copy()
	rcfg.MaxConns = freshReadConns
	rcfg.ConnConfig.RuntimeParams["application_name"] = "walcount-reads"
	pool, err := pgxpool.NewWithConfig(context.Background(), rcfg)
	if err != nil {
		return fmt.Errorf("create the fresh reads' postgres pool: %w", err)
	}
	d.readPool = pool
	d.fresh = fresh.New(fresh.Options{
		Pool: pool, Buffer: d.buf, Slot: d.cfg.Slot, Counters: d.cfg.Counters,
		Emit: func(ctx context.Context) (fresh.LSN, error) {
			content := fmt.Sprintf(`{"heartbeat":%q,"slot":%q}`, time.Now().UTC().Format(time.RFC3339Nano), d.cfg.Slot)
			return cdc.EmitMessage(ctx, pool, content)
		},
		Received: func() fresh.LSN { return fresh.LSN(d.receivedLSN()) },
		Metrics:  d.m, Logger: d.log,
	})
	return nil
}

// FreshHandler serves the fresh reads, GET /v1/counters/… (the standby
// too: it reads the same PostgreSQL and Redis as the active daemon).
func (d *Daemon) FreshHandler() http.Handler { return d.fresh.Handler() }

// Fresh returns the fresh reader.
func (d *Daemon) Fresh() *fresh.Reader { return d.fresh }

// FreshReadStatus is what the fresh reads did since this process started,
// read from their metrics (docs/fresh-reads.md).
type FreshReadStatus struct {
	// Reads counts the reads, Results the same by result
	// (walcount_fresh_reads_total).
	Reads   int64            `json:"reads"`
	Results map[string]int64 `json:"results"`
	// Waits counts the reads that waited for their min_lsn
	// (walcount_fresh_read_waits_total); Timeouts those of them that gave
	// up before walcount read through it, answered 504.
	Waits    int64 `json:"waits"`
	Timeouts int64 `json:"timeouts"`
}

// freshStatus reads the fresh reads' figures; nil when this process
// serves none.
func (d *Daemon) freshStatus() *FreshReadStatus {
	if d.fresh == nil {
		return nil
	}
	s := &FreshReadStatus{Results: make(map[string]int64, len(metrics.Results))}
	for _, r := range metrics.Results {
		n := countOf(d.m.FreshReads.WithLabelValues(r))
		s.Results[r] = n
		s.Reads += n
	}
	s.Waits = countOf(d.m.FreshReadWaits)
	s.Timeouts = s.Results[metrics.ResultTimeout]
	return s
}

// countOf reads a Prometheus counter of whole events.
func countOf(c prometheus.Counter) int64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return int64(m.GetCounter().GetValue())
}
