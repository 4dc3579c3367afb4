package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestThroughParentExtremumSurvivesKill9 runs the real binary on a max
// and a min through a parent (the newest live comment of each community,
// through posts.community_id, in communities.last_comment_at; the first
// comment of each, in rows of community_stats walcount creates), checks
// that walcount check finds nothing to fix once walcount setup made the
// via tables, kills the daemon with SIGKILL twice while the app comments,
// deletes the newest comment of a post, moves comments between posts and
// posts between communities, and soft-deletes and restores posts, and
// checks every community against SQL once a last daemon has caught up.
func TestThroughParentExtremumSurvivesKill9(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), `
CREATE TABLE communities (id integer PRIMARY KEY, last_comment_at timestamptz);
CREATE TABLE community_stats (community_id integer PRIMARY KEY, first_comment_at timestamptz);
CREATE TABLE posts (id bigint PRIMARY KEY, community_id integer, deleted boolean NOT NULL DEFAULT false);
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, at timestamptz NOT NULL, hidden boolean NOT NULL DEFAULT false);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id, at);
INSERT INTO communities (id) SELECT g FROM generate_series(1, 6) g;
INSERT INTO posts (id, community_id) SELECT g, 1 + g % 6 FROM generate_series(1, 20) g;
INSERT INTO comments (post_id, at) SELECT 1 + g % 20, now() - g * interval '1 minute' FROM generate_series(1, 200) g;`)
	path := c.writeConfig(`
counters:
  - name: community_newest
    source: comments
    key: post_id
    where: {hidden: false}
    via: {table: posts, key: id, column: community_id, where: {deleted: false}}
    target: communities
    target_key: id
    column: last_comment_at
    max: at
  - name: community_first
    source: comments
    key: post_id
    via: {table: posts, key: id, column: community_id, where: {deleted: false}}
    target: community_stats
    target_key: community_id
    column: first_comment_at
    min: at
    create_missing: true
`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, out, _ := walcount(t, env, "check"); code == exitOK || !strings.Contains(out, "walcount setup") {
		t.Fatalf("check before setup: exit %d, want the via tables named as setup's to make:\n%s", code, out)
	}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	// Nothing to fix, and no advice about the counters (an index, say):
	// setup made the via tables' indexes on (target, total).
	code, out, _ := walcount(t, env, "check")
	if code != exitOK || strings.Contains(out, "PROBLEM") {
		t.Fatalf("check after setup: exit %d, want nothing to fix:\n%s", code, out)
	}
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "warning") && strings.Contains(line, "counter ") && !strings.Contains(line, "max_slot_wal_keep_size") {
			t.Fatalf("check after setup advises on a counter: %s", line)
		}
	}
	pool, err := pgxpool.New(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	last := killTwiceUnderLoad(t, env, addr, func(ctx context.Context, rng *rand.Rand) error {
		post := 1 + rng.Int64N(24)
		newest := "(SELECT id FROM comments WHERE post_id = $1 ORDER BY at DESC LIMIT 1)"
		var err error
		switch k := rng.IntN(20); {
		case k < 7:
			_, err = pool.Exec(ctx, "INSERT INTO comments (post_id, at) VALUES ($1, now() - $2 * interval '1 ms')", post, rng.IntN(5000000))
		case k < 10:
			_, err = pool.Exec(ctx, "DELETE FROM comments WHERE id = "+newest, post)
		case k < 11:
			_, err = pool.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments ORDER BY at LIMIT 1)")
		case k < 12:
			_, err = pool.Exec(ctx, "UPDATE comments SET hidden = NOT hidden WHERE id = "+newest, post)
		case k < 14:
			_, err = pool.Exec(ctx, "UPDATE comments SET post_id = $2 WHERE id = "+newest, post, 1+rng.Int64N(24))
		case k < 17:
			var community any = 1 + rng.IntN(7)
			if rng.IntN(6) == 0 {
				community = nil
			}
			_, err = pool.Exec(ctx, "UPDATE posts SET community_id = $2 WHERE id = $1", post, community)
		case k < 19:
			_, err = pool.Exec(ctx, "UPDATE posts SET deleted = NOT deleted WHERE id = $1", post)
		default:
			_, err = pool.Exec(ctx, "INSERT INTO posts (id, community_id) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET community_id = EXCLUDED.community_id", post, 1+rng.IntN(7))
		}
		return err
	})

	// The app has stopped: the columns must reach the truth and stay.
	const off = `
SELECT (SELECT count(*) FROM communities m CROSS JOIN LATERAL (
  SELECT max(c.at) FILTER (WHERE NOT c.hidden) AS n FROM posts p JOIN comments c ON c.post_id = p.id
  WHERE p.community_id = m.id AND NOT p.deleted) t WHERE m.last_comment_at IS DISTINCT FROM t.n)
+ (SELECT count(*) FROM community_stats s FULL JOIN (SELECT p.community_id, min(c.at) AS f FROM posts p JOIN comments c ON c.post_id = p.id
  WHERE NOT p.deleted AND p.community_id IS NOT NULL GROUP BY p.community_id) t ON t.community_id = s.community_id
  WHERE s.first_comment_at IS DISTINCT FROM t.f AND (s.community_id IS NOT NULL OR t.f IS NOT NULL))`
	c.settlesExact(off, "communities")
	t.Logf("exact after two SIGKILLs: %d comments", c.count("SELECT count(*) FROM comments"))
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
