package reconcile_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/reconcile"
)

// extremumSchema is the issue 37 layout: 50 posts, each with one comment
// that nothing touches and that is the newest of its post, so that every
// max() stays right at every instant while older comments come and go.
const extremumSchema = `
CREATE TABLE posts (id bigint PRIMARY KEY, comments_count bigint NOT NULL DEFAULT 0, newest_comment timestamptz);
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, created_at timestamptz NOT NULL);
CREATE INDEX ON comments (post_id, created_at);
ALTER TABLE comments REPLICA IDENTITY FULL;
INSERT INTO posts (id) SELECT g FROM generate_series(1, 50) g;
INSERT INTO comments (post_id, created_at) SELECT g, timestamptz '2030-01-01 00:00:00+00' + g * interval '1 second'
  FROM generate_series(1, 50) g;
INSERT INTO comments (post_id, created_at) SELECT 1 + g % 50, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second'
  FROM generate_series(1, 500) g;
`

var extremumCounters = []counter.Counter{
	{Name: "post_comments", Source: "public.comments", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "comments_count"},
	{Name: "post_newest", Source: "public.comments", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "newest_comment", Max: "created_at"},
}

// TestExtremumPendingIsNoDrift: while clients insert and delete older
// comments of posts 1 to 49 (so that every key has changes on their way
// at every measurement, and no maximum ever changes), dry-run reconciles
// of the max counter and of the count over the same rows find no drift.
// A max counter's pending changes are recomputes to come, not amounts to
// add to the column. Post 50's maximum, which the test sets wrong and the
// clients never touch, is the one drift found, and a real reconcile
// corrects it.
func TestExtremumPendingIsNoDrift(t *testing.T) {
	t.Parallel()
	e := newEnv(t, extremumSchema, nil, func(cfg *config.Config) { cfg.Counters = extremumCounters })
	e.waitIdle()
	e.caughtUp()
	const check = `SELECT p.id, p.comments_count, p.newest_comment, t.n, t.m FROM posts p
CROSS JOIN LATERAL (SELECT count(*) AS n, max(c.created_at) AS m FROM comments c WHERE c.post_id = p.id) t
WHERE p.comments_count <> t.n OR p.newest_comment IS DISTINCT FROM t.m`
	e.assertNone("posts", check)
	e.exec(`UPDATE posts SET newest_comment = '2001-01-01' WHERE id = 50`)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var loadErr error
	var once sync.Once
	for c := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c)+1, 37))
			for ctx.Err() == nil {
				post := 1 + rng.Int64N(49)
				var err error
				if rng.IntN(2) == 0 {
					_, err = e.db.Exec(ctx, `INSERT INTO comments (post_id, created_at) VALUES ($1, now() - interval '1 day')`, post)
				} else {
					_, err = e.db.Exec(ctx, `DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 AND created_at < '2030-01-01' LIMIT 1)`, post)
				}
				if err != nil && ctx.Err() == nil {
					once.Do(func() { loadErr = err })
					return
				}
			}
		})
	}
	stop := func() {
		cancel()
		wg.Wait()
		if loadErr != nil {
			t.Fatalf("load: %v", loadErr)
		}
	}
	defer stop()

	for i := range 5 {
		run := e.reconcile(reconcile.Request{DryRun: true, BatchSize: 10})
		got := driftOf(run)
		if _, ok := got["50"]; !ok || len(got) != 1 || run.Drifted != 1 {
			t.Errorf("dry run %d under load: %d keys drifted %+v; want only post 50's maximum", i+1, run.Drifted, run.Drift)
		}
	}
	stop()
	e.caughtUp()
	if run := e.reconcile(reconcile.Request{}); run.Corrected != 1 || run.Drift[0].Key != "50" || run.Drift[0].Counter != "post_newest" {
		t.Fatalf("reconcile = %+v; want post 50's maximum corrected", run)
	}
	e.caughtUp()
	e.assertNone("posts", check)
}

// TestExtremumCarriedIsNoDrift: the app holds post 7's row while a newer
// comment arrives: the flush carries post 7's recompute (it never waits
// for a row lock) and its column stays behind until the row is free. A
// dry run meanwhile finds no drift: like a carried delta of a count, a
// carried recompute is the column's value on its way.
func TestExtremumCarriedIsNoDrift(t *testing.T) {
	t.Parallel()
	e := newEnv(t, extremumSchema, nil, func(cfg *config.Config) { cfg.Counters = extremumCounters })
	e.waitIdle()
	e.caughtUp()
	ctx := context.Background()
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the row is released at the end
	if _, err := tx.Exec(ctx, "SELECT 1 FROM posts WHERE id = 7 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO comments (post_id, created_at) VALUES (7, '2031-01-01')`)
	e.caughtUp()
	var carried int
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.carried WHERE counter = 'post_newest' AND key = '7'").Scan(&carried); err != nil || carried != 1 {
		t.Fatalf("post 7's recompute carried: %d rows (%v), want 1", carried, err)
	}
	for _, size := range []int{100, 1} { // the survey, and keys one by one
		if run := e.reconcile(reconcile.Request{DryRun: true, BatchSize: size}); run.Drifted != 0 {
			t.Errorf("dry run (batches of %d) with post 7's recompute carried: %d drifted %+v, want none", size, run.Drifted, run.Drift)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wait.For(t, time.Minute, "post 7's maximum recomputed once its row was free", func() bool {
		var n int
		err := e.db.QueryRow(ctx, "SELECT count(*) FROM posts WHERE id = 7 AND newest_comment = '2031-01-01'").Scan(&n)
		return err == nil && n == 1
	})
}
