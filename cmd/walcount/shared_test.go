package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// sharedCluster is one PostgreSQL cluster with the app's tables and walcount
// set up with the default slot name, against a Redis given by the test.
type sharedCluster struct {
	pg   *servers.Postgres
	args []string // the connection flags of every walcount command
	// redis is the test's Redis when it gave a *servers.Redis.
	redis *servers.Redis
}

func newSharedCluster(t *testing.T, pg *servers.Postgres, rd *servers.Redis) *sharedCluster {
	t.Helper()
	redisURL := rd.URL()
	c := &sharedCluster{pg: pg, redis: rd, args: []string{"--database-url", pg.URL(), "--redis-url", redisURL}}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.RedisURL = pg.URL(), redisURL
	conn := c.connect(t)
	if _, err := conn.Exec(context.Background(), appSchema); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Run(context.Background(), conn, setup.Options{Config: cfg}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c
}

func (c *sharedCluster) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// scalar runs a query that returns one value.
func (c *sharedCluster) scalar(t *testing.T, sql string) string {
	t.Helper()
	var v string
	if err := c.connect(t).QueryRow(context.Background(), sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// cmd returns a walcount command line against the cluster.
func (c *sharedCluster) cmd(name string, extra ...string) []string {
	return append(append([]string{name}, c.args...), extra...)
}

// TestTwoClustersOneRedis runs the walcount of one cluster and then points
// the walcount of another cluster (its own system identifier) at the same
// Redis with the same slot name. Each used to take the other's buffer for a
// history of its own written by another server, reset it and replay, over
// and over, and check passed. Now check reports it as a problem of the
// configuration (exit 2), run refuses with the fix (exit 2), from its
// preflight and, with --skip-check, from the daemon itself, and the first
// deployment streams on without a single reset.
func TestTwoClustersOneRedis(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	a := newSharedCluster(t, testenv.Postgres(t), rd)
	b := newSharedCluster(t, testenv.Postgres(t, servers.PostgresOptions{OwnSystem: true}), rd)
	const sysQuery = `SELECT system_identifier::text FROM pg_control_system()`
	if sa, sb := a.scalar(t, sysQuery), b.scalar(t, sysQuery); sa == sb {
		t.Fatalf("both clusters have system identifier %s; the test needs two systems", sa)
	}

	addr := unusedAddr(t)
	pa := startWalcount(t, nil, a.cmd("run", "--http-addr", addr, "--flush-interval", "100ms")...)
	waitStreaming(t, pa, addr)
	a.connect(t).Exec(context.Background(), `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 300) g`) //nolint:errcheck // checked by the count
	exactOnA := func(want int) {
		t.Helper()
		poll(t, fmt.Sprintf("cluster A's counts to reach %d", want), func() (bool, string) {
			got := a.scalar(t, `SELECT coalesce(sum(likes_count), 0)::text FROM posts`)
			return got == fmt.Sprint(want), "sum(likes_count) " + got
		})
	}
	exactOnA(300)

	const said = "kept by the walcount of another PostgreSQL cluster"
	code, out, _ := walcount(t, nil, b.cmd("check")...)
	if code != exitUsage || !strings.Contains(out, said) || !strings.Contains(out, "fix: give this deployment its own slot name") {
		t.Errorf("check on the second cluster: exit %d, want %d and a problem that says %q with its fix", code, exitUsage, said)
	}
	code, _, stderr := walcount(t, nil, b.cmd("run", "--http-addr", "")...)
	if code != exitUsage || !strings.Contains(stderr, said) {
		t.Errorf("run on the second cluster: exit %d, want %d and a refusal that says %q", code, exitUsage, said)
	}
	code, _, stderr = walcount(t, nil, b.cmd("run", "--skip-check", "--http-addr", "")...)
	if code != exitUsage || !strings.Contains(stderr, said) || !strings.Contains(stderr, "Fix: give this deployment a slot name of its own") {
		t.Errorf("run --skip-check on the second cluster: exit %d, want %d and an error that says %q with the fix", code, exitUsage, said)
	}
	if n := b.scalar(t, `SELECT coalesce(sum(likes_count), 0)::text FROM posts`); n != "0" {
		t.Errorf("the second cluster's counters moved to %s: it applied the first one's buffer", n)
	}

	a.connect(t).Exec(context.Background(), `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 200) g`) //nolint:errcheck // checked by the count
	exactOnA(500)
	if code := pa.stop(); code != exitOK {
		t.Errorf("the first cluster's walcount exited %d, want 0", code)
	}
	logs := pa.stderr.String()
	for _, reset := range []string{"discarding it", "resetting it", "session failed"} {
		if strings.Contains(logs, reset) {
			t.Errorf("the first cluster's walcount logged %q: the second one disturbed it", reset)
		}
	}
}
