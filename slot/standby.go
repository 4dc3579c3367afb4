package slot

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/pgversion"
)

// Execer runs a statement; *pgx.Conn and *pgxpool.Pool fit.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SnapshotNudge is how often a slot creation on a standby asks the primary
// to log a running-transactions record (pg_log_standby_snapshot).
const SnapshotNudge = 500 * time.Millisecond

// Create creates walcount's slot named name on the server of slotConn and
// scans its consistent point into lsn (a *state.LSN). On a primary it is
// CreateSQL. On a
// hot standby (decoding on a standby, PostgreSQL 16 and later) the slot is
// not a failover slot (a standby cannot make one), and its creation waits
// for a running-transactions record replayed from the primary, which the
// primary logs only every 15 s (with its bgwriter) and not at all while
// idle: while it waits, the primary (primary, database_url's server) is
// asked for one with pg_log_standby_snapshot() every SnapshotNudge.
func Create(ctx context.Context, slotConn pgversion.Querier, primary Execer, name string, lsn any) error {
	v, err := pgversion.Read(ctx, slotConn)
	if err != nil {
		return err
	}
	var standby bool
	if err := slotConn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return fmt.Errorf("read pg_is_in_recovery(): %w", err)
	}
	create := CreateSQL(v)
	if standby {
		if !v.StandbyDecoding() {
			return fmt.Errorf("replication_url names a standby of PostgreSQL %s: decoding on a standby needs PostgreSQL 16 or later; point replication_url at the primary", v)
		}
		create = "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
		if primary != nil {
			stop := nudgeSnapshots(ctx, primary)
			defer stop()
		}
	}
	return slotConn.QueryRow(ctx, create, name).Scan(lsn)
}

// nudgeSnapshots calls pg_log_standby_snapshot() on the primary every
// SnapshotNudge until stop is called. A failure is ignored: the primary
// logs such a record by itself every 15 s while it has writes.
func nudgeSnapshots(ctx context.Context, primary Execer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(SnapshotNudge)
		defer t.Stop()
		for {
			_, _ = primary.Exec(ctx, "SELECT pg_log_standby_snapshot()")
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
