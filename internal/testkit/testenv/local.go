package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// startTimeout bounds the start of a server, crash recovery included.
const startTimeout = 2 * time.Minute

// logLinesOnFailure is how much of a server's log a failed test prints.
const logLinesOnFailure = 40

// installHint tells what makes the servers available.
const installHint = "install the server binaries with `apt-get install postgresql redis-server` " +
	"(walcount tests need PostgreSQL >= 14), set " + EnvPostgresURL + " and " + EnvRedisURL +
	" to external servers (for Database and RedisURL), or make a Docker engine reachable"

// postgresHint returns what to append to a failure to start PostgreSQL. The
// error of a version that WALCOUNT_TEST_PG asks for already names the
// command that fetches it; installing Debian's postgresql would not help.
func postgresHint(err error) string {
	if errors.Is(err, servers.ErrPostgresVersionMissing) {
		return ""
	}
	return "\n(to run walcount's tests, " + installHint + ")"
}

// Postgres starts a private PostgreSQL cluster that the test may stop, crash
// and restart, and closes it when the test ends. opts, at most one, are
// passed to servers.StartPostgres. It needs the local server binaries; when
// the test fails, the server's log tail is printed.
func Postgres(tb testing.TB, opts ...servers.PostgresOptions) *servers.Postgres {
	tb.Helper()
	var opt servers.PostgresOptions
	switch len(opts) {
	case 0:
	case 1:
		opt = opts[0]
	default:
		tb.Fatalf("testenv.Postgres: got %d option values, want at most 1", len(opts))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p, err := servers.StartPostgres(ctx, opt)
	if err != nil {
		tb.Fatalf("testenv: start postgres: %v%s", err, postgresHint(err))
	}
	closeAtEnd(tb, "postgres", p)
	return p
}

// closeAtEnd closes the server s, named name in what it prints, when the
// test ends, after printing the tail of its log if the test failed.
func closeAtEnd(tb testing.TB, name string, s interface {
	LogTail(n int) string
	Close() error
}) {
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s log (last %d lines):\n%s", name, logLinesOnFailure, s.LogTail(logLinesOnFailure))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("testenv: close %s: %v", name, err)
		}
	})
}

// Redis starts a private redis-server that the test may kill and restart,
// and closes it when the test ends. It needs the local redis-server binary.
func Redis(tb testing.TB) *servers.Redis {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	r, err := servers.StartRedis(ctx, servers.RedisOptions{})
	if err != nil {
		tb.Fatalf("testenv: start redis: %v\n(to run walcount's tests, %s)", err, installHint)
	}
	closeAtEnd(tb, "redis", r)
	return r
}
