package daemon

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/reconcile"
)

// This file tests multi-level counters (issue 27 item 5): a counter whose
// source column is another counter's column. likes are counted into
// posts.likes_count, and posts.likes_count is summed per posts.user_id
// into users.total_likes. Level 2 sees level 1's flushes as ordinary
// UPDATEs of posts in the WAL (posts has REPLICA IDENTITY FULL, so old and
// new likes_count and user_id are both in the stream).

// multiSchema is appschema's posts and likes, with posts.user_id, and
// users. Its users.total_likes is users' third column, not its second as
// posts.likes_count is posts': TestMultiLevelFlushCost tells the flush
// UPDATEs of the two levels apart in pg_stat_statements, whose query id
// from PostgreSQL 18 on identifies a table by the name the query gives it,
// the flush's alias "AS t", instead of its OID. Two flush statements whose
// columns stand at the same positions with the same types then have one
// query id and count in one entry, with the text of the first (posts): on
// 18 the test found no flush UPDATE of users.
var multiSchema = appschema.SQL(appschema.Options{PostsColumns: "user_id bigint", Index: true}) + `
CREATE TABLE users (id bigint PRIMARY KEY, name text, total_likes bigint NOT NULL DEFAULT 0);
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE INDEX ON posts (user_id);
ALTER TABLE likes ADD FOREIGN KEY (post_id) REFERENCES posts ON DELETE CASCADE ON UPDATE CASCADE;
INSERT INTO users (id) SELECT g FROM generate_series(1, 10) g;
INSERT INTO posts (id, user_id) SELECT g, 1 + g % 10 FROM generate_series(1, 30) g;
INSERT INTO likes (post_id) SELECT 1 + g % 30 FROM generate_series(1, 600) g;
`

const multiConfig = testSettings + `
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: user_likes, source: posts, key: user_id, target: users, target_key: id, column: total_likes, sum: likes_count}
`

// multiTruth1 selects the posts whose likes_count is not their number of
// likes (level 1).
const multiTruth1 = `
SELECT p.id::text, p.likes_count::text, count(l.id)::text
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id HAVING p.likes_count <> count(l.id)`

// multiTruth2 selects the users whose total_likes is not the sum of their
// posts' likes_count as the posts rows are (level 2).
const multiTruth2 = `
SELECT u.id::text, u.total_likes::text, coalesce(sum(p.likes_count), 0)::text
FROM users u LEFT JOIN posts p ON p.user_id = u.id
GROUP BY u.id HAVING u.total_likes <> coalesce(sum(p.likes_count), 0)`

// multiTruth selects the users whose total_likes is not the number of
// likes of their posts: both levels exact.
const multiTruth = `
SELECT u.id::text, u.total_likes::text, count(l.id)::text
FROM users u LEFT JOIN posts p ON p.user_id = u.id LEFT JOIN likes l ON l.post_id = p.id
GROUP BY u.id HAVING u.total_likes <> count(l.id)`

// waitBothLevels waits until level 2 has applied what level 1 applied for
// everything committed so far: the first wait ends once level 1's flush of
// it committed, and that flush is a transaction the second wait passes.
func (e *env) waitBothLevels() {
	e.t.Helper()
	e.waitCaughtUp(catchUp)
	e.waitCaughtUp(catchUp)
}

func (e *env) assertMultiExact(what string) {
	e.t.Helper()
	e.assertNone(what+" (level 1)", multiTruth1)
	e.assertNone(what+" (level 2)", multiTruth2)
	e.assertNone(what+" (end to end)", multiTruth)
}

// isCode reports whether err is a PostgreSQL error with SQLSTATE code: a
// like inserted for a post deleted at the same time fails its foreign key.
func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// multiOp is one write of an app whose likes come and go and move between
// posts, and whose posts are created, deleted and moved to other users.
func multiOp(ctx context.Context, w *workload, rng *rand.Rand) error {
	post := func() int64 { return 1 + rng.Int64N(40) }
	user := func() any {
		if rng.IntN(10) == 0 {
			return nil // an orphan post counts for no user
		}
		return 1 + rng.Int64N(10)
	}
	var err error
	switch k := rng.IntN(100); {
	case k < 35:
		_, err = w.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT $1 FROM posts WHERE id = $1", post())
	case k < 55:
		_, err = w.db.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post())
	case k < 67: // a like moved to another post
		_, err = w.db.Exec(ctx, "UPDATE likes SET post_id = $2 WHERE id = (SELECT id FROM likes WHERE post_id = $1 LIMIT 1) AND EXISTS (SELECT FROM posts WHERE id = $2)", post(), post())
	case k < 79: // a post moved to another user: its whole likes_count moves
		_, err = w.db.Exec(ctx, "UPDATE posts SET user_id = $2 WHERE id = $1", post(), user())
	case k < 85: // a new post (its likes come later)
		_, err = w.db.Exec(ctx, "INSERT INTO posts (id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", post(), user())
	case k < 87: // a post deleted, its likes with it (ON DELETE CASCADE)
		_, err = w.db.Exec(ctx, "DELETE FROM posts WHERE id = $1", post())
	case k < 89: // a post re-keyed, its likes with it (ON UPDATE CASCADE)
		_, err = w.db.Exec(ctx, "UPDATE posts SET id = $2 WHERE id = $1", post(), post())
	default: // likes and a re-parent in one transaction, sometimes rolled back
		err = w.tx(ctx, func(tx pgx.Tx) error {
			p := post()
			if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id) SELECT $1 FROM posts WHERE id = $1", p); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE posts SET user_id = $2 WHERE id = $1", p, user()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id) SELECT $1 FROM posts WHERE id = $1", p); err != nil {
				return err
			}
			if rng.IntN(4) == 0 {
				return errRollback
			}
			return nil
		})
	}
	return err
}

func multiLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	newWorkload(e.db).runOps(ctx, t, clients, ops, multiOp, "23503", "23505")
}

// TestMultiLevelCounter keeps likes → posts.likes_count → users.total_likes
// exact: both levels backfilled at once on live tables, churn at both
// levels (likes moved between posts, posts moved between users, created,
// deleted and re-keyed), a crash right after a flush committed, drift at
// level 1 that level 2 follows and a reconciliation of level 1 alone
// corrects at both, drift at each level corrected by one reconciliation
// while the app writes, level 2 reconciled while level 1 carries a delta
// (nothing to correct), a post row
// held by the app (level 1 carries its delta, level 2 follows once it is
// applied), a TRUNCATE of likes (level 1's zeroing reaches level 2), one
// of posts, and posts' replica identity lost and restored (level 2
// degraded, dirty, repaired by itself).
func TestMultiLevelCounter(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, multiSchema, func(e *env) { e.cfg = e.loadConfig(multiConfig) })
	ctx := context.Background()

	// A backfill on live tables, a crash after a commit, more churn.
	d := e.crashInBackfill(8, func(clients, ops int) { multiLoad(ctx, t, e, clients, ops) })
	e.waitBothLevels()
	e.assertMultiExact("after the backfill, a crash and churn")

	// Drift at level 1 alone: level 2 follows it (it is exact with
	// respect to the posts rows, drifted or not), and reconciling level 1
	// alone corrects both: its corrections are UPDATEs of posts, which
	// level 2 counts from the WAL.
	e.exec("INSERT INTO posts (id, user_id) VALUES (3, 4), (8, 9) ON CONFLICT (id) DO UPDATE SET user_id = EXCLUDED.user_id")
	e.waitBothLevels()
	e.exec("UPDATE posts SET likes_count = likes_count + 4 WHERE id IN (3, 8)")
	e.waitBothLevels()
	e.assertNone("level 2 follows level 1's drift", multiTruth2)
	run := startRun(t, d, reconcile.Request{Counter: "post_likes"})
	if got := waitRun(t, d, run.ID); got.Status != "done" || got.Corrected != 2 {
		t.Fatalf("reconciliation of level 1 %+v, want done with 2 corrections", got)
	}
	e.waitBothLevels()
	e.assertMultiExact("after reconciling level 1 alone")

	// Drift at each level: posts 3 and 8 (which level 2 follows, as it
	// follows every posts row) and users 2 and 5.
	e.exec("UPDATE posts SET likes_count = likes_count + 4 WHERE id IN (3, 8)")
	e.exec("UPDATE users SET total_likes = total_likes - 9 WHERE id IN (2, 5)")
	var wg sync.WaitGroup
	wg.Go(func() { multiLoad(ctx, t, e, 2, 100) })
	run = startRun(t, d, reconcile.Request{})
	got := waitRun(t, d, run.ID)
	wg.Wait()
	if got.Status != "done" || got.Corrected == 0 {
		t.Fatalf("reconciliation %+v, want done with corrections", got)
	}
	e.waitBothLevels()
	e.assertMultiExact("after reconciliation")

	// The app holds a post's row: level 1 carries that post's likes, and
	// level 2 gets them once they are applied.
	e.exec("INSERT INTO posts (id, user_id) VALUES (6, 7) ON CONFLICT DO NOTHING")
	e.waitCaughtUp(catchUp)
	held := e.holdRow(6, "FOR NO KEY UPDATE")
	t.Cleanup(func() { _ = held.Rollback(context.Background()) })
	for i := range 5 {
		// The app's other writes must not wait on the held row.
		e.exec("INSERT INTO likes (post_id) SELECT id FROM posts WHERE id IN (6, $1)", 10+i)
		e.exec("UPDATE posts SET user_id = 1 + (user_id % 10) WHERE id = $1", 20+i)
	}
	waitFor(t, "post 6's likes carried", func() bool { return len(e.carried()) > 0 })
	// Level 2 reconciled meanwhile finds nothing to correct: what level 1
	// carries is not in posts.likes_count yet, so not in level 2's truth.
	run = startRun(t, d, reconcile.Request{Counter: "user_likes"})
	if got := waitRun(t, d, run.ID); got.Status != "done" || got.Corrected != 0 {
		t.Fatalf("reconciliation of level 2 while level 1 carries %+v, want done with no correction", got)
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.waitBothLevels()
	e.assertMultiExact("after a post's row was held")

	// A TRUNCATE of likes zeroes every likes_count: UPDATEs of posts that
	// level 2 counts like any other.
	e.exec("INSERT INTO posts (id, user_id) VALUES (1, 2), (2, 3), (4, 5) ON CONFLICT DO NOTHING")
	e.inTransaction("INSERT INTO likes (post_id) VALUES (1), (2)", "TRUNCATE likes", "INSERT INTO likes (post_id) VALUES (1), (1), (4)")
	multiLoad(ctx, t, e, 2, 50)
	e.waitBothLevels()
	e.assertMultiExact("after a TRUNCATE of likes")

	// A TRUNCATE of posts (level 2's source, level 1's target) and of
	// likes with it, then new posts and likes.
	e.inTransaction("TRUNCATE posts, likes", "INSERT INTO posts (id, user_id) SELECT g, 1 + g % 7 FROM generate_series(1, 25) g",
		"INSERT INTO likes (post_id) SELECT 1 + g % 25 FROM generate_series(1, 100) g")
	multiLoad(ctx, t, e, 2, 80)
	e.waitBothLevels()
	e.assertMultiExact("after a TRUNCATE of posts")

	// posts' identity lost under load: level 2 cannot attribute the old
	// rows, is degraded and dirty while level 1 goes on, and is repaired
	// by itself once the identity is back.
	e.exec("ALTER TABLE posts REPLICA IDENTITY DEFAULT")
	multiLoad(ctx, t, e, 2, 60)
	waitFor(t, "level 2 degraded", func() bool { return len(d.d.Status(ctx).Degraded) == 1 })
	e.exec("ALTER TABLE posts REPLICA IDENTITY FULL")
	multiLoad(ctx, t, e, 2, 60)
	e.waitClean(t, 2*time.Minute)
	e.waitBothLevels()
	e.assertMultiExact("after posts' identity came back")
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestMultiLevelFlushCost measures what level 2 adds to the flush. Under
// the same steady stream of likes and re-parented posts, once with
// post_likes alone and once with user_likes above it, it counts with
// pg_stat_statements the flush statements walcount ran per committed
// flush. Level 2's deltas of the flush of interval n are the UPDATE of
// posts in that flush's own transaction; they are applied by the flush of
// interval n+1, beside level 1's deltas of interval n+1: one more UPDATE
// statement (one per chunk of keys) in the same transaction, not another
// transaction. The figures are logged; what is asserted is the shape:
// level 2 runs no more flush statements than level 1.
func TestMultiLevelFlushCost(t *testing.T) {
	t.Parallel()
	configs := map[string]string{
		"one level": testSettings + `
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
`,
		"two levels": multiConfig,
	}
	for _, name := range []string{"one level", "two levels"} {
		t.Run(name, func(t *testing.T) {
			e := newEnvWith(t, multiSchema, func(e *env) { e.cfg = e.loadConfig(configs[name]) })
			var available bool
			if err := e.db.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_stat_statements')").Scan(&available); err != nil {
				t.Fatal(err)
			}
			if !available {
				t.Skipf("pg_stat_statements is not installed for PostgreSQL %d", e.pg.Major())
			}
			e.restartWith(map[string]string{"shared_preload_libraries": "pg_stat_statements"})
			e.exec("CREATE EXTENSION pg_stat_statements")
			d := e.start()
			e.waitBothLevels()
			if run := waitRun(t, d, 0); run.Status != "done" {
				t.Fatalf("backfill %+v, want done", run)
			}
			e.waitBothLevels()
			e.exec("SELECT pg_stat_statements_reset()")
			flushes0 := counterValue(d.d.m.Flushes)

			ctx := context.Background()
			var wg sync.WaitGroup
			for c := range 2 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(c+1), 99))
					for i := range 400 {
						q := "INSERT INTO likes (post_id) SELECT $1 FROM posts WHERE id = $1"
						if i%10 == 9 {
							q = "UPDATE posts SET user_id = 1 + (user_id % 10) WHERE id = $1"
						}
						if _, err := e.db.Exec(ctx, q, 1+rng.Int64N(30)); err != nil {
							t.Error(err)
							return
						}
						// Paced, so that the stream spans some 20 flush
						// intervals (a load generator's pace, not a wait).
						time.Sleep(5 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			e.waitBothLevels()
			flushes := counterValue(d.d.m.Flushes) - flushes0

			// A flush transaction's statements: begin, the timeouts, the
			// carried keys, one flush UPDATE per counter with keys (per
			// chunk), the flush's marker in and out of walcount.messages,
			// the checkpoint's compare-and-set, commit.
			var posts, users, flushTx int64
			if err := e.db.QueryRow(ctx, `
SELECT coalesce(sum(calls) FILTER (WHERE query LIKE 'WITH d AS (SELECT u.k%' AND query LIKE '%"public"."posts"%'), 0)::bigint,
       coalesce(sum(calls) FILTER (WHERE query LIKE 'WITH d AS (SELECT u.k%' AND query LIKE '%"public"."users"%'), 0)::bigint,
       coalesce(sum(calls) FILTER (WHERE query LIKE 'WITH d AS (SELECT u.k%' OR query IN ('begin', 'commit')
         OR query LIKE 'SELECT set_config(''lock_timeout''%' OR query LIKE 'SELECT counter, key, delta, since%'
         OR query LIKE '% walcount.messages %' OR query LIKE 'UPDATE walcount.checkpoint SET lsn%'), 0)::bigint
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&posts, &users, &flushTx); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d flushes; flush UPDATEs of posts %d (%.2f a flush), of users %d (%.2f a flush); %d statements in flush transactions (%.2f a flush)",
				name, flushes, posts, float64(posts)/float64(flushes), users, float64(users)/float64(flushes), flushTx, float64(flushTx)/float64(flushes))
			// The flush sizes its statements by their pace (sink's pacer):
			// on a loaded machine a flush runs several statements per
			// counter, so the count per flush is the machine's. What does
			// not depend on it: level 2 runs in level 1's transactions, and
			// its keys (10 users) are fewer than level 1's (30 posts), so it
			// runs no more statements than level 1 (bar the last flushes,
			// which apply only level 2's deltas once the stream stops).
			if flushes == 0 || posts == 0 || users > posts+3 {
				t.Fatalf("want level 2 to run no more flush UPDATEs than level 1, got %d of posts and %d of users in %d flushes", posts, users, flushes)
			}
			if name == "two levels" && users == 0 {
				t.Fatal("level 2 was never flushed")
			}
			e.assertNone("level 1", multiTruth1)
			if name == "two levels" {
				e.assertMultiExact("after the measured stream")
			}
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}
