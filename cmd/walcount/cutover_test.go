package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// adoptTriggers are adoptSchema's triggers, as the rollback of
// docs/cutover.md creates them again.
const adoptTriggers = `
CREATE TRIGGER votes_agg AFTER INSERT OR UPDATE OR DELETE ON votes FOR EACH ROW EXECUTE FUNCTION votes_agg();
CREATE TRIGGER posts_agg AFTER UPDATE OF score, community_id ON posts FOR EACH ROW EXECUTE FUNCTION posts_agg();`

// adoptRecompute sets every column of adoptSchema from its source rows,
// the rollback's recomputation. posts first: posts_agg moves communities'
// scores by the change, and the communities are then set outright.
const adoptRecompute = `
UPDATE posts p SET votes_count = v.n, up_count = v.up, score = v.s, last_vote = v.mx, first_vote = v.mn
FROM (SELECT p2.id, count(v2.id) AS n, count(v2.id) FILTER (WHERE v2.score = 1) AS up, coalesce(sum(v2.score), 0) AS s,
             max(v2.id) AS mx, min(v2.id) AS mn
      FROM posts p2 LEFT JOIN votes v2 ON v2.post_id = p2.id GROUP BY p2.id) v
WHERE v.id = p.id;
UPDATE users u SET karma = (SELECT coalesce(sum(v.score), 0) FROM votes v JOIN posts p ON p.id = v.post_id AND NOT p.deleted WHERE p.user_id = u.id);
UPDATE communities c SET score = (SELECT coalesce(sum(score), 0) FROM posts WHERE community_id = c.id),
  votes = (SELECT count(*) FROM votes v JOIN posts p ON p.id = v.post_id AND NOT p.deleted WHERE p.community_id = c.id);
UPDATE site SET votes = (SELECT count(*) FROM votes);
INSERT INTO post_stats (post_id, votes, label) SELECT post_id, count(*), 'app' FROM votes GROUP BY post_id
  ON CONFLICT (post_id) DO UPDATE SET votes = excluded.votes;
UPDATE post_stats s SET votes = 0 WHERE NOT EXISTS (SELECT 1 FROM votes WHERE post_id = s.post_id);`

// adoptChurn returns one random write of the app of adoptSchema. With
// votesOnly it writes only what the app's triggers keep exact (they do
// not follow a post to another user or a deleted flag).
func adoptChurn(pool *pgxpool.Pool, votesOnly bool) func(ctx context.Context, rng *rand.Rand) error {
	return func(ctx context.Context, rng *rand.Rand) error {
		post := 1 + rng.Int64N(120)
		pick := "(SELECT id FROM votes WHERE post_id = $1 ORDER BY random() LIMIT 1)"
		kinds := 20
		if votesOnly {
			kinds = 16
		}
		var err error
		switch k := rng.IntN(kinds); {
		case k < 8:
			_, err = pool.Exec(ctx, "INSERT INTO votes (post_id, score) VALUES ($1, $2)", post, rng.IntN(3)-1)
		case k < 11:
			_, err = pool.Exec(ctx, "DELETE FROM votes WHERE id = "+pick, post)
		case k < 14:
			_, err = pool.Exec(ctx, "UPDATE votes SET score = $2 WHERE id = "+pick, post, rng.IntN(3)-1)
		case k < 16:
			_, err = pool.Exec(ctx, "UPDATE votes SET post_id = $2 WHERE id = "+pick, post, 1+rng.Int64N(120))
		case k < 18:
			_, err = pool.Exec(ctx, "UPDATE posts SET user_id = $2, community_id = $3 WHERE id = $1", post, 1+rng.Int64N(20), 1+rng.Int64N(5))
		default:
			_, err = pool.Exec(ctx, "UPDATE posts SET deleted = NOT deleted WHERE id = $1", post)
		}
		return err
	}
}

// churning runs write from two clients until the returned stop is
// called; stop returns how many writes were made and fails the test on a
// write's error; made says how many so far.
func churning(t *testing.T, write func(ctx context.Context, rng *rand.Rand) error) (stop, made func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var n int
	var firstErr error
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			for ctx.Err() == nil {
				err := write(ctx, rng)
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
					// The app's triggers deadlock each other on the
					// aggregate rows (what walcount takes away): the
					// write is rolled back whole, so it changes nothing.
					continue
				}
				mu.Lock()
				if err != nil && ctx.Err() == nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					n++
				}
				mu.Unlock()
				// An app's pace, not a wait: unpaced, two clients on
				// a busy machine outrun the backfill's batches.
				time.Sleep(5 * time.Millisecond)
			}
		}(uint64(i))
	}
	made = func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
	return func() int {
		cancel()
		wg.Wait()
		if firstErr != nil {
			t.Fatalf("the app's write: %v", firstErr)
		}
		return n
	}, made
}

// TestCutoverFollowsThePage runs docs/cutover.md on adoptSchema, whose
// triggers keep every column exact, while the app writes all along:
// walcount setup; check names the triggers and prints their DROP; the
// drop in one transaction; walcount run; exact. Then the rollback: run
// stopped, the triggers created again and the columns recomputed in one
// transaction with the sources locked, walcount teardown; the triggers
// keep every column exact again.
func TestCutoverFollowsThePage(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), adoptSchema)
	path := c.writeConfig(adoptConfig)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + unusedAddr(t), "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	pool, err := pgxpool.New(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	off := "SELECT count(*) FROM (" + adoptOff + ") o"

	stop, _ := churning(t, adoptChurn(pool, false))
	// 1. setup, the triggers still there.
	if code, _, stderr := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d\n%s", code, stderr)
	}
	// 2. check names them, with the statement that removes each.
	code, stdout, _ := walcount(t, env, "check")
	for _, want := range []string{"DROP TRIGGER votes_agg ON votes;", "DROP TRIGGER posts_agg ON posts;"} {
		if code == exitOK || !strings.Contains(stdout, want) {
			t.Fatalf("check with the app's triggers: exit %d, want a problem naming %q:\n%s", code, want, stdout)
		}
	}
	c.exec("BEGIN; DROP TRIGGER votes_agg ON votes; DROP TRIGGER posts_agg ON posts; COMMIT")
	// 3. run.
	p := startWalcount(t, env, "run")
	// The backfill measures 10 counters in batches of 10 keys under two
	// clients' churn, each round waiting for a flush to pass its marker:
	// beside make test and two busy loops every flush went in pieces and
	// it was still progressing after 3 minutes (1,466 keys checked).
	if !wait.Until(6*time.Minute, 50*time.Millisecond, func() bool {
		return c.count(`SELECT count(*) FROM walcount.reconcile_runs WHERE slot_name = $1 AND kind = 'backfill' AND status = 'done'`, c.slot) == 1
	}) {
		var runs string
		_ = c.conn.QueryRow(context.Background(), `SELECT coalesce(string_agg(row(id, kind, status, cur_counter, keys_checked, corrected)::text, '; '), '') FROM walcount.reconcile_runs`).Scan(&runs)
		stop()
		t.Fatalf("no backfill done after 6 minutes: runs %s\nwalcount's log:\n%s", runs, p.stderr.String())
	}
	c.waitCheckpointPastNow()
	writes := stop()
	c.settlesExact(off, "cells")
	t.Logf("cut over to walcount with %d writes going on: every column exact", writes)

	// The rollback, the app writing only what its triggers keep.
	stop, made := churning(t, adoptChurn(pool, true))
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
	c.exec("BEGIN; LOCK TABLE votes, posts IN SHARE ROW EXCLUSIVE MODE;" + adoptTriggers + adoptRecompute + "COMMIT")
	if code, _, stderr := walcount(t, env, "teardown", "--yes"); code != exitOK {
		t.Fatalf("teardown: exit %d\n%s", code, stderr)
	}
	before := made()
	wait.For(t, time.Minute, "more writes under the triggers", func() bool { return made() > before+200 })
	writes = stop()
	if n := c.count(off); n != 0 {
		t.Fatalf("after the rollback, %d cells off", n)
	}
	t.Logf("rolled back to the triggers with %d writes going on: every column exact", writes)
}
