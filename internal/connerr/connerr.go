// Package connerr turns the errors of a failed connection to PostgreSQL
// into one message that says what failed, where the URL came from and what
// fixes it.
//
// pgx tries each address of a host, and with sslmode=prefer (libpq's
// default) each of them twice, with TLS and then without, and reports
// every attempt: a server without TLS and a wrong password give
// "tls error: server refused TLS connection" first, a red herring, and a
// refused connection is printed twice. Postgres keeps what matters.
package connerr

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/redact"
)

// tlsRefused is pgx's error for a server that answered sslmode=prefer's
// TLS request with no; the attempt without TLS follows.
const tlsRefused = "server refused TLS connection"

// Error is a failed connection to PostgreSQL, described.
type Error struct {
	// URL is the URL, its password masked; Origin where it came from
	// ("flag --database-url").
	URL, Origin string
	// Msg is what failed, each distinct attempt once; Fix, when known,
	// what to do.
	Msg, Fix string
	err      error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cannot connect to PostgreSQL at %s (URL from %s): %s", e.URL, e.Origin, e.Msg)
	if e.Fix != "" {
		s += "; fix: " + e.Fix
	}
	return s
}

// Unwrap returns pgx's error.
func (e *Error) Unwrap() error { return e.err }

// Postgres describes err, the error of a connection to rawURL, whose
// origin is a phrase such as "flag --database-url" or "environment
// variable WALCOUNT_DATABASE_URL" (config.Config.OriginOf).
func Postgres(err error, rawURL, origin string) error {
	if err == nil {
		return nil
	}
	e := &Error{URL: redact.URL(rawURL), Origin: origin, err: err}
	var msgs []string
	seen := map[string]bool{}
	for _, a := range attempts(err) {
		msg := a.Error()
		if inner := errors.Unwrap(a); inner != nil && strings.HasSuffix(msg, ": "+inner.Error()) {
			msg = inner.Error() // without pgx's "host:port (host): " prefix
		}
		if !seen[msg] {
			seen[msg] = true
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) > 1 {
		kept := msgs[:0]
		for _, m := range msgs {
			if !strings.Contains(m, tlsRefused) {
				kept = append(kept, m)
			}
		}
		msgs = kept
	}
	e.Msg = redact.URL(strings.Join(msgs, "; "))
	in := "the URL in " + origin
	var pgErr *pgconn.PgError
	var netErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "28P01":
		e.Fix = fmt.Sprintf("correct the user or password of %s (a password in the URL, PGPASSWORD or ~/.pgpass), or set the role's password: ALTER ROLE %s PASSWORD '…'",
			in, quoteRole(pgErr.Message))
	case errors.As(err, &pgErr) && pgErr.Code == "28000":
		e.Fix = "allow this user, database and address in the server's pg_hba.conf (replication connections too), or connect as a role it allows; then SELECT pg_reload_conf()"
	case errors.As(err, &pgErr) && pgErr.Code == "3D000":
		e.Fix = "create the database, or correct the database name at the end of " + in
	case errors.As(err, &dnsErr):
		e.Fix = "correct the host name of " + in
	case errors.As(err, &netErr) || strings.Contains(e.Msg, "dial error"):
		e.Fix = "start PostgreSQL, or correct the host and port of " + in
	case strings.Contains(e.Msg, tlsRefused):
		e.Fix = "the server does not offer TLS: enable ssl on the server, or lower sslmode in " + in
	}
	return e
}

// attempts returns the errors of each attempt pgx made.
func attempts(err error) []error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return []error{err}
	}
	inner := ce.Unwrap()
	for inner != nil {
		if j, ok := inner.(interface{ Unwrap() []error }); ok {
			return j.Unwrap()
		}
		next := errors.Unwrap(inner)
		if next == nil {
			break
		}
		if _, ok := next.(interface{ Unwrap() []error }); !ok {
			break
		}
		inner = next
	}
	return []error{ce.Unwrap()}
}

// quoteRole returns the role that "password authentication failed for
// user "x"" names, or <role>.
func quoteRole(msg string) string {
	if _, rest, ok := strings.Cut(msg, `user "`); ok {
		if name, _, ok := strings.Cut(rest, `"`); ok {
			return `"` + name + `"`
		}
	}
	return "<role>"
}
