package daemon

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
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
	w.runOps(ctx, t, clients, ops, extremumOp)
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

const visibleLateSchema = `
CREATE TABLE posts (id bigint PRIMARY KEY, newest timestamptz);
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, at timestamptz NOT NULL);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id, at);
INSERT INTO posts VALUES (1), (2);
INSERT INTO comments (post_id, at) SELECT 1 + g % 2, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour' FROM generate_series(1, 20) g;
`

const visibleLateTruth = `
SELECT p.id::text, format('%s', p.newest), format('%s', t.n)
FROM posts p CROSS JOIN LATERAL (SELECT max(c.at) AS n FROM comments c WHERE c.post_id = p.id) t
WHERE p.newest IS DISTINCT FROM t.n`

// TestExtremumCommitVisibleLate deletes the newest comment of a post in a
// transaction whose commit waits for a synchronous standby: its commit is
// in the WAL, and so in walcount's stream, while every other session still
// sees the row. A flush that recomputed the post then would keep the
// deleted comment's time for good; walcount waits until the transactions
// waiting for a synchronous standby have ended.
func TestExtremumCommitVisibleLate(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, visibleLateSchema, func(e *env) {
		e.cfg = e.loadConfig(testSettings + `
counters:
  - {name: post_newest, source: comments, key: post_id, target: posts, target_key: id, column: newest, max: at}
`)
	})
	ctx := context.Background()
	// Only the app's session below waits for the standby that never
	// comes; every other commit (walcount's, the test's) is local.
	e.exec("ALTER SYSTEM SET synchronous_commit = 'local'")
	e.exec("SELECT pg_reload_conf()")
	waitFor(t, "synchronous_commit reloaded", func() bool {
		var v string
		return e.db.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v) == nil && v == "local"
	})
	m := metrics.New()
	d := e.start(func(o *Options) { o.Metrics = m })
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after the backfill", visibleLateTruth)
	recomputed := recomputes(t, m, "post_newest")
	if recomputed < 2 {
		t.Fatalf("walcount_extremum_recomputes_total{counter=post_newest} is %v after the backfill of 2 posts, want at least 2", recomputed)
	}

	app, err := pgx.Connect(ctx, e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := app.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var done chan error
	var inflight sync.WaitGroup
	t.Cleanup(func() {
		// A delete still waiting for the standby uses app: end it
		// before closing app, whatever failed.
		_, _ = e.db.Exec(context.Background(), "SELECT pg_cancel_backend($1)", pid)
		inflight.Wait()
		_ = app.Close(context.Background())
	})
	if _, err := app.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	e.exec("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
	e.exec("SELECT pg_reload_conf()")
	t.Cleanup(func() {
		_, _ = e.db.Exec(context.Background(), "ALTER SYSTEM RESET synchronous_standby_names")
		_, _ = e.db.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	waitFor(t, "synchronous_standby_names reloaded", func() bool {
		var v string
		return app.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&v) == nil && v == "nobody"
	})

	// The checkpointer turns synchronous replication on a little after
	// the reload: until it has, a commit does not wait, and the delete is
	// made again on the newest comment left.
	for attempt := 0; ; attempt++ {
		done = make(chan error, 1)
		inflight.Go(func() {
			_, err := app.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = 1 ORDER BY at DESC LIMIT 1)")
			done <- err
		})
		waiting := false
		waitFor(t, "the app's commit waiting for the standby, or done", func() bool {
			err := e.db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')", pid).Scan(&waiting)
			return (err == nil && waiting) || len(done) > 0
		})
		if waiting {
			break
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// That delete committed at once: walcount must have applied it
		// before the next one, or the newest it still holds is the
		// comment just deleted and the window check below misreads it.
		e.waitCaughtUp(catchUp)
		if attempt == 5 {
			t.Fatal("the app's commits do not wait for the synchronous standby")
		}
	}
	// The commit is in the WAL: walcount either flushes past it or waits
	// for it to be visible.
	var flushed cdc.LSN
	if err := e.db.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&flushed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "walcount past the commit or waiting for it", func() bool {
		w, err := e.checkpoint(ctx)
		if err == nil && w >= flushed {
			t.Logf("walcount flushed past the commit (W %s)", w)
			return true
		}
		var waiting bool
		err = e.db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE '%walcount: wait for ' || 'synchronous standbys%')").Scan(&waiting)
		if err == nil && waiting {
			t.Log("walcount waits for the commit to be visible")
		}
		return err == nil && waiting
	})
	var visible bool
	if err := e.db.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM comments WHERE post_id = 1 AND at = (SELECT newest FROM posts WHERE id = 1))").Scan(&visible); err != nil {
		t.Fatal(err)
	}
	if visible {
		t.Fatal("the deleted comment is visible as deleted before the standby confirmed: the test did not make the window")
	}
	// The standby never confirms: the app gives up waiting, and the
	// delete, committed locally, becomes visible.
	e.exec("SELECT pg_cancel_backend($1)", pid)
	if err := <-done; err != nil {
		t.Logf("the app's delete: %v", err)
	}
	e.exec("ALTER SYSTEM RESET synchronous_standby_names")
	e.exec("SELECT pg_reload_conf()")
	e.waitCaughtUp(catchUp)
	e.assertNone("after a commit that was visible late", visibleLateTruth)
	if got := recomputes(t, m, "post_newest"); got <= recomputed {
		t.Fatalf("walcount_extremum_recomputes_total{counter=post_newest} is %v, want more than %v after the delete", got, recomputed)
	}
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// recomputes reads walcount_extremum_recomputes_total of a counter.
func recomputes(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.ExtremumRecomputes.WithLabelValues(name).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}
