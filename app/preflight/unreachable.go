package preflight

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err says a server did not answer, or
// answered that it cannot serve yet, rather than that something is wrong:
// a refused or dropped connection, a timeout, a PostgreSQL that is
// starting, shutting down or out of connections, a Redis that is loading
// or whose cluster has lost a master. Those pass by themselves; a password
// that is refused, a database that does not exist or a certificate that
// does not verify do not.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P03", // cannot_connect_now: starting up, shutting down, in recovery
			"57P01", "57P02", // admin_shutdown, crash_shutdown
			"53300": // too_many_connections
			return true
		}
		return false
	}
	for _, reply := range []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY"} {
		if strings.HasPrefix(err.Error(), reply+" ") || strings.Contains(err.Error(), ": "+reply+" ") {
			return true
		}
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// refusedLogin reports whether err is a server's refusal of walcount's
// credentials: PostgreSQL's invalid_password or
// invalid_authorization_specification (pg_hba.conf), Redis's WRONGPASS or
// NOAUTH. A person must change a password, a role or pg_hba.conf.
func refusedLogin(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "28P01" || pgErr.Code == "28000"
	}
	for _, reply := range []string{"WRONGPASS", "NOAUTH"} {
		if strings.Contains(err.Error(), reply) {
			return true
		}
	}
	return false
}

// Unreachable reports whether every problem of the refusal is a server
// that did not answer (CauseUnreachable): walcount run then waits and
// checks again instead of exiting.
func (r *Refusal) Unreachable() bool {
	for _, p := range r.Problems {
		if p.Cause != CauseUnreachable {
			return false
		}
	}
	return len(r.Problems) > 0
}
