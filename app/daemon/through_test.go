package daemon

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/reconcile"
)

// This file tests counters through a parent row (issue 27 item 1): a
// vote carries post_id, and its score belongs to the post's creator
// (users.karma); a comment carries post_id, and it counts for the post's
// community (communities.comments). Both count only the posts that are
// neither deleted nor removed, and the comments that are not deleted.
// Posts move between creators and communities, are soft-deleted, removed,
// restored, hard-deleted (their votes and comments with them) and
// re-keyed, all while votes and comments come and go.

const throughSchema = `
CREATE TABLE users (id bigint PRIMARY KEY, karma bigint NOT NULL DEFAULT 0);
CREATE TABLE communities (id integer PRIMARY KEY, comments integer NOT NULL DEFAULT 0);
CREATE TABLE posts (id bigint PRIMARY KEY, creator_id bigint, community_id integer NOT NULL,
  deleted boolean NOT NULL DEFAULT false, removed boolean NOT NULL DEFAULT false, title text NOT NULL DEFAULT '');
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL REFERENCES posts ON DELETE CASCADE ON UPDATE CASCADE, score smallint NOT NULL);
ALTER TABLE votes REPLICA IDENTITY FULL;
CREATE INDEX ON votes (post_id);
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL REFERENCES posts ON DELETE CASCADE ON UPDATE CASCADE,
  deleted boolean NOT NULL DEFAULT false);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id);
INSERT INTO users (id) SELECT g FROM generate_series(1, 10) g;
INSERT INTO communities (id) SELECT g FROM generate_series(1, 5) g;
INSERT INTO posts (id, creator_id, community_id, deleted) SELECT g, 1 + g % 10, 1 + g % 5, g % 7 = 0 FROM generate_series(1, 30) g;
INSERT INTO votes (post_id, score) SELECT 1 + g % 30, CASE WHEN g % 3 = 0 THEN -1 ELSE 1 END FROM generate_series(1, 600) g;
INSERT INTO comments (post_id, deleted) SELECT 1 + g % 30, g % 11 = 0 FROM generate_series(1, 300) g;
-- Posts the load never touches: only the backfill counts them.
INSERT INTO posts (id, creator_id, community_id, removed) SELECT g, 1 + g % 10, 1 + g % 5, g % 9 = 0 FROM generate_series(100, 160) g;
INSERT INTO votes (post_id, score) SELECT 100 + g % 61, CASE WHEN g % 4 = 0 THEN -1 ELSE 1 END FROM generate_series(1, 900) g;
INSERT INTO comments (post_id) SELECT 100 + g % 61 FROM generate_series(1, 400) g;
`

const throughConfig = testSettings + `
counters:
  - name: user_karma
    source: votes
    key: post_id
    via: {table: posts, key: id, column: creator_id, where: {deleted: false, removed: false}}
    target: users
    target_key: id
    column: karma
    sum: score
  - name: community_comments
    source: comments
    key: post_id
    where: {deleted: false}
    via: {table: posts, key: id, column: community_id, where: {deleted: false, removed: false}}
    target: communities
    target_key: id
    column: comments
`

// throughKarma selects the users whose karma is not the sum of the scores
// of the votes on their live posts.
const throughKarma = `
SELECT u.id::text, u.karma::text, coalesce(sum(v.score), 0)::text
FROM users u LEFT JOIN posts p ON p.creator_id = u.id AND NOT p.deleted AND NOT p.removed
LEFT JOIN votes v ON v.post_id = p.id
GROUP BY u.id HAVING u.karma <> coalesce(sum(v.score), 0)`

// throughComments selects the communities whose comments is not the
// number of live comments on their live posts.
const throughComments = `
SELECT c.id::text, c.comments::text, count(m.id)::text
FROM communities c LEFT JOIN posts p ON p.community_id = c.id AND NOT p.deleted AND NOT p.removed
LEFT JOIN comments m ON m.post_id = p.id AND NOT m.deleted
GROUP BY c.id HAVING c.comments <> count(m.id)`

func (e *env) assertThroughExact(what string) {
	e.t.Helper()
	e.assertNone(what+" (karma)", throughKarma)
	e.assertNone(what+" (community comments)", throughComments)
}

// throughOp is one write of the app: votes and comments come and go,
// posts change hands, communities and state.
func throughOp(ctx context.Context, w *workload, rng *rand.Rand) error {
	post := func() int64 { return 1 + rng.Int64N(40) }
	user := func() any {
		if rng.IntN(10) == 0 {
			return nil // a post with no creator counts for nobody
		}
		return 1 + rng.Int64N(10)
	}
	score := func() int { return []int{-1, 1, 1}[rng.IntN(3)] }
	var err error
	switch k := rng.IntN(100); {
	case k < 25:
		_, err = w.db.Exec(ctx, "INSERT INTO votes (post_id, score) SELECT $1, $2 FROM posts WHERE id = $1", post(), score())
	case k < 35:
		_, err = w.db.Exec(ctx, "DELETE FROM votes WHERE id = (SELECT id FROM votes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post())
	case k < 40: // a vote changed its mind
		_, err = w.db.Exec(ctx, "UPDATE votes SET score = -score WHERE id = (SELECT id FROM votes WHERE post_id = $1 LIMIT 1)", post())
	case k < 52:
		_, err = w.db.Exec(ctx, "INSERT INTO comments (post_id) SELECT $1 FROM posts WHERE id = $1", post())
	case k < 57:
		_, err = w.db.Exec(ctx, "UPDATE comments SET deleted = NOT deleted WHERE id = (SELECT id FROM comments WHERE post_id = $1 LIMIT 1)", post())
	case k < 60:
		_, err = w.db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE post_id = $1 ORDER BY random() LIMIT 1)", post())
	case k < 68: // a post moved to another creator: its whole score moves
		_, err = w.db.Exec(ctx, "UPDATE posts SET creator_id = $2 WHERE id = $1", post(), user())
	case k < 73: // a post moved to another community
		_, err = w.db.Exec(ctx, "UPDATE posts SET community_id = $2 WHERE id = $1", post(), 1+rng.IntN(5))
	case k < 80: // soft-deleted or restored, removed or restored
		col := []string{"deleted", "removed"}[rng.IntN(2)]
		_, err = w.db.Exec(ctx, "UPDATE posts SET "+col+" = NOT "+col+" WHERE id = $1", post())
	case k < 83: // an edit that changes nothing counted
		_, err = w.db.Exec(ctx, "UPDATE posts SET title = md5(random()::text) WHERE id = $1", post())
	case k < 88: // a new post (its votes come later)
		_, err = w.db.Exec(ctx, "INSERT INTO posts (id, creator_id, community_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", post(), user(), 1+rng.IntN(5))
	case k < 90: // a post deleted, its votes and comments with it
		_, err = w.db.Exec(ctx, "DELETE FROM posts WHERE id = $1", post())
	case k < 92: // a post re-keyed, its votes and comments with it
		_, err = w.db.Exec(ctx, "UPDATE posts SET id = $2 WHERE id = $1", post(), post())
	default: // votes and a move in one transaction, sometimes rolled back
		err = w.tx(ctx, func(tx pgx.Tx) error {
			p := post()
			if _, err := tx.Exec(ctx, "INSERT INTO votes (post_id, score) SELECT $1, $2 FROM posts WHERE id = $1", p, score()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE posts SET creator_id = $2, deleted = $3 WHERE id = $1", p, user(), rng.IntN(4) == 0); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO comments (post_id) SELECT $1 FROM posts WHERE id = $1", p); err != nil {
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

func throughLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	newWorkload(e.db).runOps(ctx, t, clients, ops, throughOp, "23503", "23505")
}

// TestThroughParent keeps users.karma (votes through posts.creator_id) and
// communities.comments (comments through posts.community_id) exact:
// user_karma added to a deployment that kept community_comments alone
// while posts were created (its backfill seeds their via rows), both
// backfilled on live tables with rows that predate walcount, churn with posts moved, soft-deleted,
// removed, restored, deleted and re-keyed, a crash right after a flush
// committed, drift in a via table and in the targets corrected by one
// reconciliation while the app writes, a user's row held by the app,
// TRUNCATEs of the votes and of the posts, and the posts' replica
// identity lost and restored (degraded, dirty, repaired by itself).
func TestThroughParent(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, throughSchema, func(e *env) { e.cfg = e.loadConfig(throughConfig) })
	ctx := context.Background()

	// community_comments alone first (user_karma added later, as to a
	// running deployment): the posts created meanwhile get no via row of
	// user_karma, whose backfill seeds them.
	full := e.cfg
	e.cfg.Counters = slices.DeleteFunc(slices.Clone(full.Counters), func(c counter.Counter) bool { return c.Through.Counter == "user_karma" })
	d := e.start()
	throughLoad(ctx, t, e, 3, 100)
	// Posts of then, with votes, that the load never touches again.
	e.exec("INSERT INTO posts (id, creator_id, community_id) SELECT g, 1 + g % 10, 1 + g % 5 FROM generate_series(200, 215) g")
	e.exec("INSERT INTO votes (post_id, score) SELECT 200 + g % 16, 1 FROM generate_series(1, 160) g")
	e.waitCaughtUp(catchUp)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	e.cfg = full

	// A backfill on live tables, a crash after a commit, more churn.
	d = e.crashInBackfill(8, func(clients, ops int) { throughLoad(ctx, t, e, clients, ops) })
	// user_karma's backfill follows the one the first daemon left
	// unfinished.
	waitFor(t, "user_karma backfilled", func() bool {
		var done bool
		err := e.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM walcount.reconcile_runs WHERE kind = 'backfill' AND status = 'done' AND 'user_karma' = ANY (counters))
  AND NOT EXISTS (SELECT 1 FROM walcount.reconcile_runs WHERE status IN ('pending', 'running'))`).Scan(&done)
		return err == nil && done
	})
	e.waitBothLevels()
	e.assertThroughExact("after the backfill, a crash and churn")

	// Drift in a via table (the votes of post 3 and 8) and in the targets.
	e.exec("INSERT INTO posts (id, creator_id, community_id) VALUES (3, 4, 1), (8, 9, 2) ON CONFLICT (id) DO UPDATE SET creator_id = EXCLUDED.creator_id, deleted = false, removed = false")
	e.waitBothLevels()
	e.exec("UPDATE walcount.via_user_karma SET total = total + 4 WHERE parent_key IN (3, 8)")
	e.exec("UPDATE walcount.via_community_comments SET passes = 0 WHERE parent_key = 3")
	e.exec("UPDATE users SET karma = karma - 9 WHERE id IN (2, 5)")
	e.waitBothLevels()
	var wg sync.WaitGroup
	wg.Go(func() { throughLoad(ctx, t, e, 2, 100) })
	run := startRun(t, d, reconcile.Request{})
	got := waitRun(t, d, run.ID)
	wg.Wait()
	if got.Status != "done" || got.Corrected == 0 {
		t.Fatalf("reconciliation %+v, want done with corrections", got)
	}
	e.waitBothLevels()
	e.assertThroughExact("after reconciliation")

	// The app holds a user's row: the flush carries that user's karma and
	// applies the others; once the row is free, it is applied.
	e.exec("INSERT INTO posts (id, creator_id, community_id) VALUES (6, 7, 1) ON CONFLICT (id) DO UPDATE SET creator_id = 7, deleted = false, removed = false")
	e.waitBothLevels()
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "SELECT 1 FROM users WHERE id = 7 FOR NO KEY UPDATE"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		e.exec("INSERT INTO votes (post_id, score) VALUES (6, 1)")
	}
	waitFor(t, "user 7's karma carried", func() bool { return len(e.carried()) > 0 })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.waitBothLevels()
	e.assertThroughExact("after a user's row was held")

	// A TRUNCATE of the votes, then new ones.
	e.inTransaction("INSERT INTO posts (id, creator_id, community_id) VALUES (3, 4, 1), (6, 7, 1), (8, 9, 2) ON CONFLICT DO NOTHING",
		"INSERT INTO votes (post_id, score) VALUES (3, 1), (8, -1)", "TRUNCATE votes", "INSERT INTO votes (post_id, score) VALUES (3, 1), (3, 1), (6, -1)")
	throughLoad(ctx, t, e, 2, 50)
	e.waitBothLevels()
	e.assertThroughExact("after a TRUNCATE of votes")

	// A TRUNCATE of the parent, with its votes and comments: every via
	// row's passes and target are zeroed, and so is every total above.
	e.inTransaction("TRUNCATE posts, votes, comments",
		"INSERT INTO posts (id, creator_id, community_id) SELECT g, 1 + g % 9, 1 + g % 4 FROM generate_series(1, 25) g",
		"INSERT INTO votes (post_id, score) SELECT 1 + g % 25, 1 FROM generate_series(1, 100) g",
		"INSERT INTO comments (post_id) SELECT 1 + g % 20 FROM generate_series(1, 60) g")
	throughLoad(ctx, t, e, 2, 60)
	e.waitBothLevels()
	e.assertThroughExact("after a TRUNCATE of posts")

	// The parent's identity lost under load: the via table's counters of
	// posts cannot attribute the old rows, are degraded and dirty while
	// the others go on, and are repaired by themselves once it is back.
	e.exec("ALTER TABLE posts REPLICA IDENTITY DEFAULT")
	throughLoad(ctx, t, e, 2, 60)
	waitFor(t, "the via counters of posts degraded", func() bool { return len(d.d.Status(ctx).Degraded) > 0 })
	e.exec("ALTER TABLE posts REPLICA IDENTITY FULL")
	throughLoad(ctx, t, e, 2, 60)
	e.waitClean(t, 2*time.Minute)
	e.waitBothLevels()
	e.assertThroughExact("after posts' identity came back")
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
