package main

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestStandbyDecodingSurvivesKill9 runs the real binary with its slot on
// a hot standby (replication_url names it; PostgreSQL 16 and later) while
// the app likes, unlikes and moves likes between posts on the primary,
// kills it with SIGKILL twice while it streams, and checks every post
// against SQL once a last daemon has caught up: the flushes, markers and
// W that the primary holds and the slot position the standby holds agree
// through a real crash, not only the simulated one of the daemon's tests.
func TestStandbyDecodingSurvivesKill9(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	if pg.Major() < 16 {
		t.Skipf("decoding on a standby needs PostgreSQL 16 or later; WALCOUNT_TEST_PG selects %d", pg.Major())
	}
	standby, err := pg.StartStandby(ctx, servers.StandbyOptions{Settings: map[string]string{"recovery_min_apply_delay": "200ms"}})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	c := newCLI(t, pg.URL(), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;")
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REPLICATION_URL=" + standby.URL(), "WALCOUNT_REDIS_URL=" + c.redis,
		"WALCOUNT_SLOT=" + c.slot, "WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	if code, out, errOut := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := countOn(t, standby.URL(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+c.slot+"'"); n != 1 {
		t.Fatalf("setup made %d slots named %s on the standby", n, c.slot)
	}
	pool, err := pgxpool.New(ctx, c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	last := killTwiceUnderLoad(t, env, addr, func(load context.Context, rng *rand.Rand) error {
		post := 1 + rng.Int64N(20)
		pick := "(SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)"
		var err error
		switch k := rng.IntN(10); {
		case k < 6:
			_, err = pool.Exec(load, "INSERT INTO likes (post_id) VALUES ($1)", post)
		case k < 8:
			_, err = pool.Exec(load, "UPDATE likes SET post_id = $2 WHERE id = "+pick, post, 1+rng.Int64N(20))
		default:
			_, err = pool.Exec(load, "DELETE FROM likes WHERE id = "+pick, post)
		}
		return err
	})

	const off = `SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)`
	c.settlesExact(off, "posts")
	if n := c.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", c.slot); n != 0 {
		t.Errorf("the primary holds slot %s: walcount decoded there, not on the standby", c.slot)
	}
	t.Logf("exact after two SIGKILLs: %d likes", c.count("SELECT count(*) FROM likes"))
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}

// countOn runs a count query on the server at url.
func countOn(t *testing.T, url, query string) int {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
