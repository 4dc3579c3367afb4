package daemon

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/reconcile"
)

// This file tests the latest / maximum / minimum kinds (issue 27 item 3):
// max and min of a timestamptz, an integer and a numeric per key, filtered,
// and a site-wide maximum, under inserts, deletes of the current extremum,
// updates of the value, key moves and filter changes.

const extremumSchema = `
CREATE TABLE posts (id bigint PRIMARY KEY, newest_comment timestamptz, first_comment timestamptz,
  top_score integer, low_price numeric(10,2));
CREATE TABLE site (id integer PRIMARY KEY, top_score bigint);
INSERT INTO site VALUES (1, NULL);
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint, created_at timestamptz,
  score integer, price numeric(10,2), deleted boolean NOT NULL DEFAULT false);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id, created_at) WHERE NOT deleted;
CREATE INDEX ON comments (post_id, score);
CREATE INDEX ON comments (post_id, price);
CREATE INDEX ON comments (score);
INSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;
INSERT INTO comments (post_id, created_at, score, price, deleted)
SELECT 1 + g % 18, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute 7.25 seconds',
       CASE WHEN g % 7 <> 0 THEN g % 50 - 10 END, CASE WHEN g % 4 <> 0 THEN (g % 300) / 4.0 END, g % 9 = 0
FROM generate_series(1, 500) g;
`

const extremumConfig = testSettings + `
counters:
  - {name: post_newest, source: comments, key: post_id, target: posts, target_key: id, column: newest_comment, max: created_at, where: { deleted: false }}
  - {name: post_first, source: comments, key: post_id, target: posts, target_key: id, column: first_comment, min: created_at}
  - {name: post_top, source: comments, key: post_id, target: posts, target_key: id, column: top_score, max: score}
  - {name: post_low, source: comments, key: post_id, target: posts, target_key: id, column: low_price, min: price}
  - {name: site_top, source: comments, target: site, target_key: id, target_row: 1, column: top_score, max: score}
`

// extremumTruth selects the posts and the site row whose extrema differ
// from SQL's own max and min.
const extremumTruth = `
SELECT p.id::text, format('%s/%s/%s/%s', p.newest_comment, p.first_comment, p.top_score, p.low_price),
       format('%s/%s/%s/%s', t.n, t.f, t.s, t.p)
FROM posts p CROSS JOIN LATERAL (
  SELECT max(c.created_at) FILTER (WHERE NOT c.deleted) AS n, min(c.created_at) AS f, max(c.score) AS s, min(c.price) AS p
  FROM comments c WHERE c.post_id = p.id) t
WHERE (p.newest_comment, p.first_comment, p.top_score, p.low_price) IS DISTINCT FROM (t.n, t.f, t.s, t.p)
UNION ALL
SELECT 'site', format('%s', s.top_score), format('%s', t.s)
FROM site s CROSS JOIN (SELECT max(score) AS s FROM comments) t
WHERE s.top_score IS DISTINCT FROM t.s`

// extremumOp is one write of an app that comments, deletes the newest
// comment of a post (or its top-scored one), edits scores and prices,
// moves comments between posts and soft-deletes them.
func extremumOp(ctx context.Context, w *workload, rng *rand.Rand) error {
	maybe := func(v any) any {
		if rng.IntN(6) == 0 {
			return nil
		}
		return v
	}
	var err error
	switch k := rng.IntN(100); {
	case k < 35:
		_, err = w.db.Exec(ctx, `INSERT INTO comments (post_id, created_at, score, price) VALUES ($1, now() - $2 * interval '1 second', $3, $4)`,
			w.post(rng), rng.IntN(100000), maybe(rng.IntN(200)-50), maybe(float64(rng.IntN(40000))/100))
	case k < 50: // the current maximum goes
		_, err = w.db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC NULLS LAST LIMIT 1)", w.post(rng))
	case k < 58:
		_, err = w.db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY score DESC NULLS LAST LIMIT 1)", w.post(rng))
	case k < 62: // the site-wide maximum goes
		_, err = w.db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments ORDER BY score DESC NULLS LAST LIMIT 1)")
	case k < 70:
		_, err = w.db.Exec(ctx, "UPDATE comments SET score = $2 WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY score DESC NULLS LAST LIMIT 1)", w.post(rng), maybe(rng.IntN(200)-50))
	case k < 76:
		_, err = w.db.Exec(ctx, "UPDATE comments SET price = $2 WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY price NULLS LAST LIMIT 1)", w.post(rng), maybe(float64(rng.IntN(40000))/100))
	case k < 84:
		_, err = w.db.Exec(ctx, "UPDATE comments SET deleted = NOT deleted WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC NULLS LAST LIMIT 1)", w.post(rng))
	case k < 92:
		_, err = w.db.Exec(ctx, "UPDATE comments SET post_id = $2 WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC NULLS LAST LIMIT 1)", w.post(rng), w.post(rng))
	default: // several at once, sometimes rolled back
		err = w.tx(ctx, func(tx pgx.Tx) error {
			p := w.post(rng)
			if _, err := tx.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC NULLS LAST LIMIT 1)", p); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO comments (post_id, created_at, score, price) VALUES ($1, now(), $2, 0.5)`, p, rng.IntN(300)); err != nil {
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

func extremumLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	w := newWorkload(e.db)
	w.posts = 20
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c+21), uint64(ops)*17+uint64(time.Now().UnixNano())))
			for range ops {
				if ctx.Err() != nil {
					return
				}
				if err := extremumOp(ctx, w, rng); err != nil {
					if ctx.Err() == nil {
						w.bad.Add(1)
					}
				} else {
					w.ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	w.report(t)
	if w.bad.Load() > 0 {
		t.Fatalf("%d operations failed", w.bad.Load())
	}
}

// TestExtremumKinds keeps max and min counters exact: a backfill of the
// rows that exist before walcount starts while the app writes, a crash
// after a flush's commit under churn that keeps deleting the current
// maximum, a target row held by the app, drift that reconciliation
// corrects, and a TRUNCATE of the source followed by new rows.
func TestExtremumKinds(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, extremumSchema, func(e *env) { e.cfg = e.loadConfig(extremumConfig) })
	ctx := context.Background()
	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, 6)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	var wg sync.WaitGroup
	wg.Go(func() { extremumLoad(ctx, t, e, 3, 250) })
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
	e.assertNone("after the backfill, a crash and churn", extremumTruth)

	// The app holds a post while its newest comment is deleted and
	// others arrive: the recompute is carried and applied once the row is
	// free.
	held, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Rollback(context.Background()) })
	if _, err := held.Exec(ctx, "SELECT 1 FROM posts WHERE id = 3 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	e.exec("DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = 3 AND NOT deleted ORDER BY created_at DESC LIMIT 1)")
	extremumLoad(ctx, t, e, 2, 100)
	waitFor(t, "post 3 carried", func() bool { return len(e.carried()) > 0 })
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.waitCaughtUp(catchUp)
	e.assertNone("after the row was held", extremumTruth)

	// Drift: walcount's columns written behind its back.
	e.exec("UPDATE posts SET newest_comment = '2000-01-01', top_score = NULL WHERE id IN (4, 5)")
	e.exec("UPDATE site SET top_score = -1")
	run := startRun(t, d, reconcile.Request{})
	if got := waitRun(t, d, run.ID); got.Status != "done" || got.Corrected != 5 {
		t.Fatalf("reconciliation %+v, want done with 5 corrections", got)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after reconciliation", extremumTruth)

	e.inTransaction("INSERT INTO comments (post_id, created_at, score) VALUES (1, now(), 1000)", "TRUNCATE comments",
		"INSERT INTO comments (post_id, created_at, score, price) VALUES (2, now(), 7, 1.25), (2, now() - interval '1 day', NULL, 0.75)")
	e.waitCaughtUp(catchUp)
	e.assertNone("after a TRUNCATE", extremumTruth)
	extremumLoad(ctx, t, e, 2, 60)
	e.waitCaughtUp(catchUp)
	e.assertNone("after a TRUNCATE and churn", extremumTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
