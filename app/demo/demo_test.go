package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestRun runs the whole demo on throwaway servers for a few seconds and
// requires the exact verdict.
func TestRun(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Servers:       servers.Throwaway(nil),
		Duration:      3 * time.Second,
		Clients:       4,
		Posts:         100,
		FlushInterval: 200 * time.Millisecond,
		Out:           &out,
	})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !res.Exact() {
		t.Fatalf("not exact: %d mismatches: %+v", res.MismatchCount, res.Mismatches)
	}
	if res.Posts != 100 {
		t.Errorf("verified %d posts, want 100", res.Posts)
	}
	if res.Likes == 0 || res.Unlikes == 0 {
		t.Errorf("the load did nothing: %d likes, %d unlikes", res.Likes, res.Unlikes)
	}
	if want := res.Likes - res.Unlikes; res.Rows != want {
		t.Errorf("%d likes rows, want likes - unlikes = %d", res.Rows, want)
	}
	text := out.String()
	if !strings.Contains(text, "verdict: EXACT: all 100 posts") {
		t.Errorf("no exact verdict in the output")
	}
	if n := strings.Count(text, "\nt="); n < 2 {
		t.Errorf("%d plain view lines, want at least 2", n)
	}
	if strings.Contains(text, "\x1b[") {
		t.Errorf("ANSI escape sequences in the plain output")
	}
}

// TestRunOnGivenServers runs the demo on servers it does not own, twice
// (the second run finds nothing of the first), and checks that it leaves
// no slot, publication, schema, checkpoint row or Redis key behind.
func TestRunOnGivenServers(t *testing.T) {
	t.Parallel()
	pg, rs := testenv.Postgres(t), testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := range 2 {
		res, err := Run(ctx, Options{
			DatabaseURL:   pg.URL(),
			RedisURL:      rs.URL(),
			Duration:      time.Second,
			Clients:       2,
			Posts:         20,
			FlushInterval: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		if !res.Exact() {
			t.Fatalf("run %d: not exact: %+v", i+1, res.Mismatches)
		}
	}

	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var slots, pubs, schemas, checkpoints int
	err = conn.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
  (SELECT count(*) FROM pg_publication WHERE pubname = $2),
  (SELECT count(*) FROM pg_namespace WHERE nspname = $3),
  (SELECT count(*) FROM walcount.checkpoint WHERE slot_name = $1)`, Slot, Publication, Schema).
		Scan(&slots, &pubs, &schemas, &checkpoints)
	if err != nil {
		t.Fatal(err)
	}
	if slots+pubs+schemas+checkpoints != 0 {
		t.Errorf("left behind: %d slots, %d publications, %d schemas, %d checkpoint rows", slots, pubs, schemas, checkpoints)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	n, err := rdb.Exists(ctx, buffer.KeysFor(Slot).All()...).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d redis keys left behind", n)
	}
}
