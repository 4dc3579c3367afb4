package cdc

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/operator"
)

// ErrPooler means the replication connection reached a connection pooler,
// not PostgreSQL: PgBouncer answers a replication=database connection with
// "unsupported startup parameter: replication". A replication connection
// cannot be pooled; it must reach the server directly.
var ErrPooler = operator.NewError("the replication connection reached a connection pooler (such as PgBouncer), which cannot carry a replication connection")

// PoolerFix names the fix of ErrPooler.
const PoolerFix = "point replication_url (--replication-url, WALCOUNT_REPLICATION_URL) at PostgreSQL itself, not at the pooler; database_url may stay on the pooler"

// IsPoolerRefusal reports whether err is a pooler's refusal of a
// replication connection. PgBouncer refuses the first startup parameter it
// does not know ("unsupported startup parameter: replication", or one of
// the session settings walcount sends first); PostgreSQL itself never says
// that.
func IsPoolerRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "unsupported startup parameter")
}

// poolerError wraps a pooler's refusal in ErrPooler, with the fix.
func poolerError(err error) error {
	if IsPoolerRefusal(err) {
		return fmt.Errorf("%w (%v): %s", ErrPooler, err, PoolerFix)
	}
	return err
}
