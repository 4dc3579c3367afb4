package daemon

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/fresh"
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
		Metrics: d.m, Logger: d.log,
	})
	return nil
}

// FreshHandler serves the fresh reads, GET /v1/counters/… (the standby
// too: it reads the same PostgreSQL and Redis as the active daemon).
func (d *Daemon) FreshHandler() http.Handler { return d.fresh.Handler() }

// Fresh returns the fresh reader.
func (d *Daemon) Fresh() *fresh.Reader { return d.fresh }
