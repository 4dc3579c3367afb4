package daemon

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/reconcile"
)

// This file tests a max and a min through a parent row (issue 35 §4): the
// newest live comment of each community (comments carry post_id, the
// post names its community) and the lowest comment score of each
// community, counting only the posts that are not deleted. Comments come
// and go, the newest one of a post or of a community is deleted, values
// change, comments move between posts, posts move between communities
// (or to none), are soft-deleted and restored, hard-deleted (their
// comments stay: there is no foreign key, so a comment may also name a
// post that does not exist yet) and re-keyed.

const throughExtremumSchema = `
CREATE TABLE communities (id integer PRIMARY KEY, last_comment_at timestamptz, low_score integer);
CREATE TABLE posts (id bigint PRIMARY KEY, community_id integer, deleted boolean NOT NULL DEFAULT false, title text NOT NULL DEFAULT '');
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, created_at timestamptz NOT NULL,
  score integer, deleted boolean NOT NULL DEFAULT false);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id, created_at) WHERE NOT deleted;
CREATE INDEX ON comments (post_id, score);
INSERT INTO communities (id) SELECT g FROM generate_series(1, 6) g;
INSERT INTO posts (id, community_id, deleted) SELECT g, 1 + g % 5, g % 7 = 0 FROM generate_series(1, 30) g;
INSERT INTO comments (post_id, created_at, score, deleted)
SELECT 1 + g % 33, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute 7.25 seconds',
       CASE WHEN g % 6 <> 0 THEN g % 80 - 20 END, g % 11 = 0
FROM generate_series(1, 400) g;
-- Posts the load never touches: only the backfill counts them.
INSERT INTO posts (id, community_id) SELECT g, 1 + g % 6 FROM generate_series(100, 130) g;
INSERT INTO comments (post_id, created_at, score)
SELECT 100 + g % 31, timestamptz '2025-06-01 00:00:00+00' + g * interval '1 hour', g % 50 - 30 FROM generate_series(1, 300) g;
`

const throughExtremumConfig = testSettings + `
counters:
  - name: community_newest
    source: comments
    key: post_id
    where: {deleted: false}
    via: {table: posts, key: id, column: community_id, where: {deleted: false}}
    target: communities
    target_key: id
    column: last_comment_at
    max: created_at
  - name: community_low
    source: comments
    key: post_id
    via: {table: posts, key: id, column: community_id, where: {deleted: false}}
    target: communities
    target_key: id
    column: low_score
    min: score
`

// throughExtremumTruth selects the communities whose newest live comment
// or lowest score differs from SQL's own over their live posts.
const throughExtremumTruth = `
SELECT c.id::text, format('%s/%s', c.last_comment_at, c.low_score), format('%s/%s', t.n, t.l)
FROM communities c CROSS JOIN LATERAL (
  SELECT max(m.created_at) FILTER (WHERE NOT m.deleted) AS n, min(m.score) AS l
  FROM posts p JOIN comments m ON m.post_id = p.id WHERE p.community_id = c.id AND NOT p.deleted) t
WHERE (c.last_comment_at, c.low_score) IS DISTINCT FROM (t.n, t.l)`

// throughExtremumVia selects the via rows of community_newest that differ
// from what the posts and comments say (no row counts as 0, 0, NULL).
const throughExtremumVia = `
SELECT k::text, format('%s/%s/%s', coalesce(v.target, 0), coalesce(v.passes, 0), v.total), format('%s/%s/%s', t.target, t.passes, t.total)
FROM (SELECT parent_key AS k FROM walcount.via_community_newest UNION SELECT id FROM posts UNION SELECT post_id FROM comments) keys
LEFT JOIN walcount.via_community_newest v ON v.parent_key = keys.k
CROSS JOIN LATERAL (SELECT coalesce((SELECT community_id FROM posts WHERE id = k), 0) AS target,
  (SELECT count(*) FROM posts WHERE id = k AND NOT deleted AND community_id IS NOT NULL) AS passes,
  (SELECT max(created_at) FROM comments WHERE post_id = k AND NOT deleted) AS total) t
WHERE (coalesce(v.target, 0), coalesce(v.passes, 0)) <> (t.target, t.passes) OR v.total IS DISTINCT FROM t.total`

func (e *env) assertThroughExtremumExact(what string) {
	e.t.Helper()
	e.assertNone(what+" (via rows)", throughExtremumVia)
	e.assertNone(what, throughExtremumTruth)
}

// throughExtremumOp is one write of the app.
func throughExtremumOp(ctx context.Context, w *workload, rng *rand.Rand) error {
	post := func() int64 { return 1 + rng.Int64N(40) }
	community := func() any {
		if rng.IntN(10) == 0 {
			return nil // a post in no community counts for none
		}
		return 1 + rng.IntN(6)
	}
	score := func() any {
		if rng.IntN(6) == 0 {
			return nil
		}
		return rng.IntN(300) - 100
	}
	var err error
	switch k := rng.IntN(100); {
	case k < 25:
		_, err = w.db.Exec(ctx, "INSERT INTO comments (post_id, created_at, score) VALUES ($1, now() - $2 * interval '1 second', $3)",
			post(), rng.IntN(100000), score())
	case k < 33: // the newest comment of a post goes
		_, err = w.db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 AND NOT deleted ORDER BY created_at DESC LIMIT 1)", post())
	case k < 40: // the newest comment of a community goes: its maximum
		_, err = w.db.Exec(ctx, `DELETE FROM comments WHERE id = (SELECT m.id FROM comments m JOIN posts p ON p.id = m.post_id
  WHERE p.community_id = $1 AND NOT p.deleted AND NOT m.deleted ORDER BY m.created_at DESC LIMIT 1)`, 1+rng.IntN(6))
	case k < 45: // the lowest score of a community goes: its minimum
		_, err = w.db.Exec(ctx, `DELETE FROM comments WHERE id = (SELECT m.id FROM comments m JOIN posts p ON p.id = m.post_id
  WHERE p.community_id = $1 AND NOT p.deleted ORDER BY m.score NULLS LAST LIMIT 1)`, 1+rng.IntN(6))
	case k < 50: // the newest comment of a post edited back in time
		_, err = w.db.Exec(ctx, "UPDATE comments SET created_at = created_at - $2 * interval '1 second' WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC LIMIT 1)",
			post(), rng.IntN(1000000))
	case k < 54:
		_, err = w.db.Exec(ctx, "UPDATE comments SET score = $2 WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY score NULLS LAST LIMIT 1)", post(), score())
	case k < 59:
		_, err = w.db.Exec(ctx, "UPDATE comments SET deleted = NOT deleted WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC LIMIT 1)", post())
	case k < 64: // a comment moved to another post
		_, err = w.db.Exec(ctx, "UPDATE comments SET post_id = $2 WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY created_at DESC LIMIT 1)", post(), post())
	case k < 73: // a post moved to another community, or to none
		_, err = w.db.Exec(ctx, "UPDATE posts SET community_id = $2 WHERE id = $1", post(), community())
	case k < 80: // soft-deleted or restored
		_, err = w.db.Exec(ctx, "UPDATE posts SET deleted = NOT deleted WHERE id = $1", post())
	case k < 82: // an edit that changes nothing counted
		_, err = w.db.Exec(ctx, "UPDATE posts SET title = md5(random()::text) WHERE id = $1", post())
	case k < 87: // a new post: it may have comments already
		_, err = w.db.Exec(ctx, "INSERT INTO posts (id, community_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", post(), community())
	case k < 90: // a post deleted: its comments stay
		_, err = w.db.Exec(ctx, "DELETE FROM posts WHERE id = $1", post())
	case k < 92: // a post re-keyed: its comments stay with the old key
		_, err = w.db.Exec(ctx, "UPDATE posts SET id = $2 WHERE id = $1", post(), post())
	default: // a comment and a move in one transaction, sometimes rolled back
		err = w.tx(ctx, func(tx pgx.Tx) error {
			p := post()
			if _, err := tx.Exec(ctx, "INSERT INTO comments (post_id, created_at, score) VALUES ($1, now(), $2)", p, score()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE posts SET community_id = $2, deleted = $3 WHERE id = $1", p, community(), rng.IntN(4) == 0); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 AND NOT deleted ORDER BY created_at DESC LIMIT 1)", post()); err != nil {
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

func throughExtremumLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	newWorkload(e.db).runOps(ctx, t, clients, ops, throughExtremumOp, "23505")
}

// TestThroughParentExtremum keeps communities.last_comment_at (the max of
// comments.created_at through posts.community_id) and
// communities.low_score (the min of comments.score through the same)
// exact: a backfill on live tables with rows that predate walcount, a
// crash right after a flush committed, churn over every change above,
// drift in the via table and in the targets corrected by one
// reconciliation while the app writes, the via rows of deleted posts
// collected, and a TRUNCATE of the comments. Before, such counters were
// refused ("a max or min cannot go through a parent yet").
func TestThroughParentExtremum(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, throughExtremumSchema, func(e *env) { e.cfg = e.loadConfig(throughExtremumConfig) })
	ctx := context.Background()

	d := e.crashInBackfill(8, func(clients, ops int) { throughExtremumLoad(ctx, t, e, clients, ops) })
	e.waitBothLevels()
	e.assertThroughExtremumExact("after the backfill, a crash and churn")

	// Drift in the via table (a post's total and passes) and in the
	// targets, corrected while the app writes.
	e.exec("INSERT INTO posts (id, community_id) VALUES (3, 4), (8, 2) ON CONFLICT (id) DO UPDATE SET community_id = EXCLUDED.community_id, deleted = false")
	e.exec("INSERT INTO comments (post_id, created_at, score) VALUES (3, now(), 1), (8, now() - interval '1 day', 2)")
	e.waitBothLevels()
	e.exec("UPDATE walcount.via_community_newest SET total = '2100-01-01' WHERE parent_key = 3")
	e.exec("UPDATE walcount.via_community_low SET passes = 0 WHERE parent_key = 8")
	e.exec("UPDATE communities SET last_comment_at = '1999-01-01', low_score = -1000 WHERE id IN (1, 5)")
	e.waitBothLevels()
	var wg sync.WaitGroup
	wg.Go(func() { throughExtremumLoad(ctx, t, e, 2, 100) })
	run := startRun(t, d, reconcile.Request{})
	got := waitRun(t, d, run.ID)
	wg.Wait()
	if got.Status != "done" || got.Corrected == 0 {
		t.Fatalf("reconciliation %+v, want done with corrections", got)
	}
	e.waitBothLevels()
	e.assertThroughExtremumExact("after reconciliation")

	// Posts deleted with their comments: their via rows, NULL totals, are
	// collected, and nothing above changes.
	e.inTransaction("DELETE FROM comments WHERE post_id BETWEEN 1 AND 10", "DELETE FROM posts WHERE id BETWEEN 1 AND 10")
	e.waitBothLevels()
	if n, err := d.d.CollectVia(ctx); err != nil || n < 20 {
		t.Fatalf("collection: %d rows (%v), want the 20 of the 10 posts deleted", n, err)
	}
	throughExtremumLoad(ctx, t, e, 2, 60)
	e.waitBothLevels()
	e.assertThroughExtremumExact("after a collection")

	// A TRUNCATE of the comments, then new ones.
	e.inTransaction("INSERT INTO comments (post_id, created_at, score) VALUES (12, now(), -500)", "TRUNCATE comments",
		"INSERT INTO comments (post_id, created_at, score) VALUES (12, now(), 7), (14, now() - interval '1 day', NULL)")
	e.waitBothLevels()
	e.assertThroughExtremumExact("after a TRUNCATE")
	throughExtremumLoad(ctx, t, e, 2, 60)
	e.waitBothLevels()
	e.assertThroughExtremumExact("after a TRUNCATE and churn")
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
