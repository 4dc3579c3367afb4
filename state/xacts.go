package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Xact is a running transaction that holds an xid, as pg_stat_activity
// shows it.
type Xact struct {
	PID             int32
	Age             time.Duration
	ApplicationName string
	State           string
}

// OldestXact returns the oldest running transaction that holds an xid,
// other than backend except's, and false when there is none that this role
// may see (other roles' sessions need pg_read_all_stats). The creation of a
// logical slot waits for every such transaction that was running when it
// began, this one the longest.
func OldestXact(ctx context.Context, q Querier, except uint32) (Xact, bool, error) {
	var x Xact
	var secs float64
	err := q.QueryRow(ctx, `
SELECT pid, coalesce(extract(epoch FROM now() - xact_start), 0)::float8, coalesce(application_name, ''), coalesce(state, '')
FROM pg_stat_activity
WHERE backend_xid IS NOT NULL AND pid <> $1
ORDER BY xact_start NULLS LAST
LIMIT 1`, int64(except)).Scan(&x.PID, &secs, &x.ApplicationName, &x.State)
	if errors.Is(err, pgx.ErrNoRows) {
		return Xact{}, false, nil
	}
	if err != nil {
		return Xact{}, false, fmt.Errorf("read the oldest running transaction: %w", err)
	}
	x.Age = time.Duration(secs * float64(time.Second))
	return x, true, nil
}
