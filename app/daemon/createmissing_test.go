package daemon

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/failpoint"
)

// The app's aggregate rows, created by walcount: post_aggregates has no
// row for most posts, NOT NULL columns without defaults (score, label),
// and three counters on the same row.
const createSchema = `
CREATE TABLE post_aggregates (post_id bigint PRIMARY KEY, comments bigint NOT NULL DEFAULT 0,
  score bigint NOT NULL, upvotes bigint NOT NULL DEFAULT 0, label text NOT NULL);
INSERT INTO post_aggregates (post_id, score, label) SELECT g, 0, 'app' FROM generate_series(1, 5) g;
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, score integer NOT NULL, up boolean);
ALTER TABLE comments REPLICA IDENTITY FULL;
INSERT INTO comments (post_id, score, up) SELECT 1 + g % 5, g % 7 - 3, CASE WHEN g % 3 <> 0 THEN g % 2 = 0 END FROM generate_series(1, 300) g;
`

const createConfig = testSettings + `
counters:
  - name: post_comments
    source: comments
    key: post_id
    target: post_aggregates
    target_key: post_id
    column: comments
    create_missing: {defaults: {score: 0, label: walcount}}
  - {name: post_score, source: comments, key: post_id, target: post_aggregates, target_key: post_id, column: score, sum: score,
     create_missing: {defaults: {label: walcount}}}
  - {name: post_upvotes, source: comments, key: post_id, target: post_aggregates, target_key: post_id, column: upvotes, sum: up,
     create_missing: {defaults: {score: 0, label: walcount}}}
`

// createTruth lists the posts whose aggregate row is missing or differs
// from its comments.
const createTruth = `
SELECT coalesce(a.post_id, c.post_id)::text, format('%s/%s/%s', a.comments, a.score, a.upvotes), format('%s/%s/%s', c.n, c.s, c.u)
FROM post_aggregates a FULL JOIN (SELECT post_id, count(*) AS n, sum(score) AS s,
  coalesce(sum(CASE WHEN up THEN 1 WHEN NOT up THEN -1 END), 0) AS u FROM comments GROUP BY post_id) c ON c.post_id = a.post_id
WHERE a.post_id IS NULL OR (a.comments, a.score, a.upvotes) <> (coalesce(c.n, 0), coalesce(c.s, 0), coalesce(c.u, 0))`

// createLoad is the app: comments on posts 1 to posts, most of which have
// no aggregate row yet, some deleted again, and now and then the app's
// own creation of an aggregate row (ON CONFLICT DO NOTHING, as an app
// that shares the rows with walcount must write it).
func createLoad(ctx context.Context, t testing.TB, e *env, clients, ops int, posts int64) {
	t.Helper()
	var wg sync.WaitGroup
	var bad atomicInt
	var firstErr error
	var mu sync.Mutex
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c+31), uint64(time.Now().UnixNano())))
			for range ops {
				var err error
				post := 1 + rng.Int64N(posts)
				switch n := rng.IntN(10); {
				case n < 6:
					up := []any{nil, true, false}[rng.IntN(3)]
					_, err = e.db.Exec(ctx, "INSERT INTO comments (post_id, score, up) VALUES ($1, $2, $3), ($1, $2 + 1, NULL)", post, rng.IntN(11)-5, up)
				case n < 8:
					_, err = e.db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY id DESC LIMIT 1)", post)
				case n < 9:
					_, err = e.db.Exec(ctx, "UPDATE comments SET post_id = $2, score = score + 1 WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY id LIMIT 1)", post, 1+rng.Int64N(posts))
				default:
					// The app creates the row itself, in a transaction
					// that comments on it too.
					tx, berr := e.db.Begin(ctx)
					if berr != nil {
						err = berr
						break
					}
					_, err = tx.Exec(ctx, "INSERT INTO post_aggregates (post_id, score, label) VALUES ($1, 0, 'app') ON CONFLICT (post_id) DO NOTHING", post)
					if err == nil {
						_, err = tx.Exec(ctx, "INSERT INTO comments (post_id, score, up) VALUES ($1, 2, true)", post)
					}
					if err == nil {
						err = tx.Commit(ctx)
					} else {
						_ = tx.Rollback(ctx)
					}
				}
				if err != nil {
					bad.add()
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if bad.load() > 0 {
		t.Fatalf("%d app statements failed, the first: %v", bad.load(), firstErr)
	}
}

// TestCreateMissingTargetRows: create_missing counters create the
// aggregate rows the app does not: a backfill of the rows that exist
// while comments go to posts without rows, a crash right after a flush's
// commit (before its marker is read), three counters creating the same
// row in one flush, the app creating some rows itself concurrently, and
// comments deleted or moved. Every post with comments ends with one row
// holding each counter's exact value, and no counter is dirty.
func TestCreateMissingTargetRows(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, createSchema, func(e *env) { e.cfg = e.loadConfig(createConfig) })
	ctx := context.Background()
	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, 5)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	var wg sync.WaitGroup
	wg.Go(func() { createLoad(ctx, t, e, 3, 150, 40) })
	if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	disarm()
	d = e.start()
	wg.Wait()
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after the backfill, a crash and churn on missing rows", createTruth)
	if st := d.d.Status(ctx); len(st.Dirty) != 0 || len(st.Degraded) != 0 {
		t.Fatalf("creating rows left dirty %v, degraded %v", st.Dirty, st.Degraded)
	}
	var created, byApp int
	if err := e.db.QueryRow(ctx, "SELECT count(*) FILTER (WHERE label = 'walcount'), count(*) FILTER (WHERE label = 'app') FROM post_aggregates").Scan(&created, &byApp); err != nil {
		t.Fatal(err)
	}
	if created == 0 {
		t.Fatalf("walcount created no row (%d by the app)", byApp)
	}

	// Killed right after committing a flush that created rows: the next
	// session neither inserts them again nor adds their deltas twice.
	// The hook runs after each flush's commit and crashes after the
	// first one that created any of the rows of posts 100 to 109.
	fp = &failpoint.Set{}
	var crashed atomic.Bool
	disarm = fp.Arm(failpoint.AfterCommit, func() error {
		var n int
		if err := e.db.QueryRow(context.Background(), "SELECT count(*) FROM post_aggregates WHERE post_id >= 100").Scan(&n); err != nil || n == 0 || crashed.Swap(true) {
			return nil
		}
		return failpoint.ErrCrash
	})
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	e.exec("INSERT INTO comments (post_id, score, up) SELECT 100 + g % 10, g, true FROM generate_series(1, 50) g")
	d = e.start(func(o *Options) { o.Failpoints = fp })
	if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	disarm()
	d = e.start()
	e.waitCaughtUp(catchUp)
	e.assertNone("after a crash after creating rows", createTruth)

	// A delete for a post whose row is gone (the app deleted the row
	// and kept its comments): the row is created with a negative count,
	// marked dirty, and repaired to the true count.
	e.exec("DELETE FROM post_aggregates WHERE post_id = 101")
	e.waitCaughtUp(catchUp)
	e.exec("DELETE FROM comments WHERE id = (SELECT max(id) FROM comments WHERE post_id = 101)")
	e.waitCaughtUp(catchUp)
	e.waitClean(t, 2*time.Minute)
	e.assertNone("after a delete for a missing row", createTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCreateMissingCrossedByAppInsert: a flush hands over a comment on a
// post with no aggregate row, and the app creates the row (ON CONFLICT DO
// NOTHING) before the flush commits: the flush adds the delta to the
// app's row, and at its marker the delta stays there (without
// create_missing it would belong to no row and be taken off again).
func TestCreateMissingCrossedByAppInsert(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, createSchema, func(e *env) { e.cfg = e.loadConfig(createConfig) })
	ctx := context.Background()
	d := e.start()
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	e.waitCaughtUp(catchUp)
	// The flush waits behind the checkpoint row's lock, after its
	// hand-over.
	held, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Rollback(context.Background()) })
	if _, err := held.Exec(ctx, "SELECT 1 FROM walcount.checkpoint FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	e.exec("INSERT INTO comments (post_id, score, up) VALUES (300, 4, true), (300, 1, false)")
	waitFor(t, "a flush waiting on the checkpoint", func() bool {
		var n int
		_ = e.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%checkpoint%'`).Scan(&n)
		return n > 0
	})
	e.exec("INSERT INTO post_aggregates (post_id, score, label) VALUES (300, 0, 'app') ON CONFLICT (post_id) DO NOTHING")
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec("INSERT INTO comments (post_id, score, up) VALUES (1, 1, NULL)")
	e.waitCaughtUp(catchUp)
	e.assertNone("after a flush crossed the app's creation of the row", createTruth)
	var label string
	if err := e.db.QueryRow(ctx, "SELECT label FROM post_aggregates WHERE post_id = 300").Scan(&label); err != nil || label != "app" {
		t.Fatalf("post 300's row: label %q (%v), want the app's", label, err)
	}
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCreateMissingAppInsertInProgress: the app inserts a post's
// aggregate row and keeps its transaction open. The flush's INSERT of that
// key would wait for it (a unique index has no SKIP LOCKED): it gives up
// after lock_timeout, carries that key alone, and every other key, created
// or updated, is applied meanwhile; once the app commits, the carried
// delta lands on the app's row.
func TestCreateMissingAppInsertInProgress(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, createSchema, func(e *env) { e.cfg = e.loadConfig(createConfig) })
	ctx := context.Background()
	d := e.start()
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	held, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Rollback(context.Background()) })
	if _, err := held.Exec(ctx, "INSERT INTO post_aggregates (post_id, score, label) VALUES (500, 0, 'app')"); err != nil {
		t.Fatal(err)
	}
	e.exec("INSERT INTO comments (post_id, score, up) VALUES (500, 3, true), (501, 4, false), (1, 5, NULL)")
	others := `SELECT count(*) FROM post_aggregates a JOIN (SELECT post_id, count(*) AS n, sum(score) AS s FROM comments GROUP BY post_id) c
  ON c.post_id = a.post_id WHERE a.post_id IN (1, 501) AND (a.comments, a.score) = (c.n, c.s)`
	waitFor(t, "the other keys applied while post 500's insert is in progress", func() bool {
		var n int
		_ = e.db.QueryRow(ctx, others).Scan(&n)
		return n == 2
	})
	waitFor(t, "post 500 carried", func() bool {
		for _, c := range e.carried() {
			if c.Key == "500" {
				return true
			}
		}
		return false
	})
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.waitCaughtUp(catchUp)
	e.assertNone("after the app's insert committed", createTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
