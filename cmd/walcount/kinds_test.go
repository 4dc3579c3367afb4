package main

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestKindsSurviveKill9 runs the real binary on counters with filters
// beyond equality (IS NOT NULL, IN, <>), a boolean summed as +1/-1 and a
// sum over a generated column walcount derives and a site-wide total with
// no key and a count of an append_only event log (identity: its primary
// key) and a count into rows walcount creates (create_missing), kills it
// with SIGKILL
// twice while the app writes, and checks every post against SQL once a
// last daemon has caught up.
func TestKindsSurviveKill9(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), `
CREATE TABLE posts (id bigint PRIMARY KEY, reactions bigint NOT NULL DEFAULT 0, votes bigint NOT NULL DEFAULT 0, points bigint NOT NULL DEFAULT 0);
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint, user_id bigint, kind text, up boolean, base integer,
  total integer GENERATED ALWAYS AS (3 * base - (up)::integer) STORED);
ALTER TABLE votes REPLICA IDENTITY FULL;
CREATE INDEX ON votes (post_id);
INSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;
CREATE TABLE site (id integer PRIMARY KEY, votes bigint NOT NULL DEFAULT 0);
ALTER TABLE posts ADD COLUMN events bigint NOT NULL DEFAULT 0;
CREATE TABLE events (id bigserial PRIMARY KEY, post_id bigint NOT NULL);
CREATE TABLE post_stats (post_id bigint PRIMARY KEY, votes bigint NOT NULL, label text NOT NULL);
INSERT INTO site VALUES (1);`)
	path := c.writeConfig(`
counters:
  - {name: post_reactions, source: votes, key: post_id, target: posts, target_key: id, column: reactions,
     where: { user_id: { not: null }, kind: [like, love], up: { not: false } }}
  - {name: post_votes, source: votes, key: post_id, target: posts, target_key: id, column: votes, sum: up}
  - {name: post_points, source: votes, key: post_id, target: posts, target_key: id, column: points, sum: total}
  - {name: post_events, source: events, key: post_id, target: posts, target_key: id, column: events, append_only: true}
  - {name: site_votes, source: votes, target: site, target_key: id, target_row: 1, column: votes, where: { kind: { not: null } }}
  - {name: stat_votes, source: votes, key: post_id, target: post_stats, target_key: post_id, column: votes,
     create_missing: {defaults: {label: walcount}}}
`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	pool, err := pgxpool.New(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	kinds := []any{"like", "love", "spam", nil}
	last := killTwiceUnderLoad(t, env, addr, func(ctx context.Context, rng *rand.Rand) error {
		post := 1 + rng.Int64N(20)
		var user, up, base any = rng.Int64N(9), rng.IntN(2) == 0, rng.IntN(11) - 5
		if rng.IntN(5) == 0 {
			user = nil
		}
		if rng.IntN(6) == 0 {
			up = nil
		}
		pick := "(SELECT id FROM votes WHERE post_id = $1 ORDER BY random() LIMIT 1)"
		var err error
		switch k := rng.IntN(10); {
		case k < 4:
			_, err = pool.Exec(ctx, "INSERT INTO votes (post_id, user_id, kind, up, base) VALUES ($1, $2, $3, $4, $5)", post, user, kinds[rng.IntN(4)], up, base)
			if err == nil {
				_, err = pool.Exec(ctx, "INSERT INTO events (post_id) VALUES ($1)", post)
			}
		case k < 5:
			_, err = pool.Exec(ctx, "UPDATE votes SET up = NOT up, base = base + 1 WHERE id = "+pick, post)
		case k < 6:
			_, err = pool.Exec(ctx, "UPDATE votes SET kind = $2, user_id = $3 WHERE id = "+pick, post, kinds[rng.IntN(4)], user)
		case k < 8:
			_, err = pool.Exec(ctx, "UPDATE votes SET post_id = $2 WHERE id = "+pick, post, 1+rng.Int64N(20))
		default:
			_, err = pool.Exec(ctx, "DELETE FROM votes WHERE id = "+pick, post)
		}
		return err
	})

	// The app has stopped: the columns must reach the truth and stay.
	const off = `
SELECT count(*) FROM posts p CROSS JOIN LATERAL (
  SELECT count(*) FILTER (WHERE v.user_id IS NOT NULL AND v.kind IN ('like', 'love') AND v.up <> false) AS r,
         coalesce(sum(CASE WHEN v.up THEN 1 WHEN NOT v.up THEN -1 END), 0) AS v, coalesce(sum(v.total), 0) AS p
  FROM votes v WHERE v.post_id = p.id) t
WHERE (p.reactions, p.votes, p.points) <> (t.r, t.v, t.p)
  OR (SELECT votes FROM site) <> (SELECT count(*) FROM votes WHERE kind IS NOT NULL)
  OR p.events <> (SELECT count(*) FROM events e WHERE e.post_id = p.id)
  OR EXISTS (SELECT 1 FROM (SELECT post_id, count(*) AS n FROM votes WHERE post_id IS NOT NULL GROUP BY post_id) v
    FULL JOIN post_stats s ON s.post_id = v.post_id WHERE s.post_id IS NULL OR s.votes <> coalesce(v.n, 0))`
	c.settlesExact(off, "posts")
	t.Logf("exact after two SIGKILLs: %d votes", c.count("SELECT count(*) FROM votes"))
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
