package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// Environment variables that select external servers.
const (
	// EnvPostgresURL names a PostgreSQL server (wal_level=logical, a
	// superuser) on which Database creates its databases.
	EnvPostgresURL = "WALCOUNT_TEST_POSTGRES_URL"
	// EnvRedisURL names a Redis server whose database indexes 1..15
	// RedisURL leases to tests; index 0 holds the leases.
	EnvRedisURL = "WALCOUNT_TEST_REDIS_URL"
)

// Timeouts of the shared-server helpers.
const (
	// adminTimeout bounds creating or dropping one test database.
	adminTimeout = time.Minute
)

// sharedSettings are the settings of the binary-wide cluster: many tests,
// each with its own slot, may run in parallel on it.
var sharedSettings = map[string]string{
	"max_replication_slots": "64",
	"max_wal_senders":       "64",
	"max_connections":       "300",
}

// source says where a shared server comes from.
type source int

const (
	sourceNone source = iota
	sourceExternal
	sourceLocal
	sourceDocker
)

// chooseSource picks where a shared server comes from: the environment
// variable, else the local binaries, else Docker (asked only when needed).
func chooseSource(envURL string, haveLocal bool, haveDocker func() bool) source {
	switch {
	case envURL != "":
		return sourceExternal
	case haveLocal:
		return sourceLocal
	case haveDocker():
		return sourceDocker
	default:
		return sourceNone
	}
}

// shared holds the servers that live as long as the test binary. Main closes
// them.
var shared struct {
	pgOnce  sync.Once
	pgURL   string            // admin URL of the shared cluster
	pg      *servers.Postgres // when the cluster is local
	pgErr   error
	pgClose func() error

	redisOnce  sync.Once
	redisURL   string // a Docker redis, leased like an external one
	redisErr   error
	redisClose func() error
}

// sharedPostgresURL returns the admin URL of the server on which Database
// creates databases, starting the shared cluster on first use.
func sharedPostgresURL() (string, *servers.Postgres, error) {
	if u := os.Getenv(EnvPostgresURL); u != "" {
		return u, nil, nil
	}
	shared.pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		p, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: sharedSettings})
		if err == nil {
			shared.pg, shared.pgURL, shared.pgClose = p, p.URL(), p.Close
			return
		}
		if !errors.Is(err, servers.ErrNoPostgres) {
			shared.pgErr = fmt.Errorf("start shared postgres: %w", err)
			return
		}
		switch chooseSource("", false, dockerReachable) {
		case sourceDocker:
			shared.pgURL, shared.pgClose, shared.pgErr = startPostgresContainer(ctx)
		default:
			shared.pgErr = fmt.Errorf("start shared postgres: %w; no Docker engine answers either", err)
		}
	})
	return shared.pgURL, shared.pg, shared.pgErr
}

// Database creates a fresh, empty database for the test and returns its URL.
// The database lives on a cluster shared by the test binary (or on the
// server named by WALCOUNT_TEST_POSTGRES_URL); when the test ends, its
// backends are terminated, its replication slots dropped and the database
// dropped. The cluster has wal_level=logical.
func Database(tb testing.TB) string {
	tb.Helper()
	admin, pg, err := sharedPostgresURL()
	if err != nil {
		tb.Fatalf("testenv: %v%s", err, postgresHint(err))
	}
	name := "test_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := createDatabase(ctx, admin, name); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() && pg != nil {
			tb.Logf("postgres log lines of database %s:\n%s", name, grepLines(pg.LogTail(2000), "@"+name+" "))
		}
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := dropDatabase(ctx, admin, name); err != nil {
			tb.Errorf("testenv: %v", err)
		}
	})
	u, err := withPath(admin, "/"+name)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return u
}

// createDatabase runs CREATE DATABASE on the admin connection.
func createDatabase(ctx context.Context, admin, name string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("create database %s: connect: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// dropDatabase terminates the database's backends (walsenders included),
// drops its replication slots and drops it, retrying until ctx is done: a
// slot can be busy for a moment after its walsender was told to exit.
func dropDatabase(ctx context.Context, admin, name string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("drop database %s: connect: %w", name, err)
	}
	defer conn.Close(context.Background())
	const (
		terminate = `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`
		dropSlots = `SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots
			WHERE database = $1 AND NOT active`
	)
	var lastErr error
	for {
		lastErr = nil
		if _, err := conn.Exec(ctx, terminate, name); err != nil {
			lastErr = err
		} else if _, err := conn.Exec(ctx, dropSlots, name); err != nil {
			lastErr = err
		} else if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			lastErr = err
		} else {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %s: %w (last error: %v)", name, ctx.Err(), lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// withPath returns rawURL with its path replaced.
func withPath(rawURL, path string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("parse server URL %q: want scheme://host[:port]/... (%v)", redact(rawURL), err)
	}
	u.Path = path
	u.RawPath = ""
	return u.String(), nil
}

// redact masks a password in a URL, for error messages.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "<not a URL>"
	}
	return u.Redacted()
}

// randomHex returns 2n random hex digits.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// Main runs the tests of a package and then closes the servers shared by the
// test binary. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// closeShared closes the shared servers that were started.
func closeShared() error {
	var errs []error
	if shared.pgClose != nil {
		if err := shared.pgClose(); err != nil {
			errs = append(errs, fmt.Errorf("close shared postgres: %w", err))
		}
	}
	if shared.redisClose != nil {
		if err := shared.redisClose(); err != nil {
			errs = append(errs, fmt.Errorf("close shared redis: %w", err))
		}
	}
	return errors.Join(errs...)
}
