package main

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestExtremumSurvivesKill9 runs the real binary on max and min counters
// (the newest comment of each post, filtered; the lowest score; a
// site-wide maximum; the newest comment kept in rows walcount creates,
// for posts 21 to 25 from the backfill alone), kills it with SIGKILL twice while the app keeps
// deleting and editing the current maximum, and checks every post against
// SQL's max and min once a last daemon has caught up.
func TestExtremumSurvivesKill9(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), `
CREATE TABLE posts (id bigint PRIMARY KEY, newest timestamptz, low_score integer);
CREATE TABLE site (id integer PRIMARY KEY, top_score bigint);
INSERT INTO site VALUES (1);
CREATE TABLE post_latest (post_id bigint PRIMARY KEY, newest timestamptz, label text NOT NULL);
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint, at timestamptz, score integer, hidden boolean NOT NULL DEFAULT false);
ALTER TABLE comments REPLICA IDENTITY FULL;
CREATE INDEX ON comments (post_id, at);
CREATE INDEX ON comments (post_id, score);
CREATE INDEX ON comments (score);
INSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;
INSERT INTO comments (post_id, at, score) SELECT 21 + g % 5, now() - g * interval '1 minute', g FROM generate_series(1, 50) g;`)
	path := c.writeConfig(`
counters:
  - {name: post_newest, source: comments, key: post_id, target: posts, target_key: id, column: newest, max: at, where: { hidden: false }}
  - {name: post_low, source: comments, key: post_id, target: posts, target_key: id, column: low_score, min: score}
  - {name: site_top, source: comments, target: site, target_key: id, target_row: 1, column: top_score, max: score}
  - {name: latest, source: comments, key: post_id, target: post_latest, target_key: post_id, column: newest, max: at,
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

	last := killTwiceUnderLoad(t, env, addr, func(ctx context.Context, rng *rand.Rand) error {
		post := 1 + rng.Int64N(20)
		newest := "(SELECT id FROM comments WHERE post_id = $1 ORDER BY at DESC NULLS LAST LIMIT 1)"
		var err error
		switch k := rng.IntN(10); {
		case k < 4:
			_, err = pool.Exec(ctx, "INSERT INTO comments (post_id, at, score) VALUES ($1, now() - $2 * interval '1 ms', $3)", post, rng.IntN(5000), rng.IntN(1000)-500)
		case k < 6:
			_, err = pool.Exec(ctx, "DELETE FROM comments WHERE id = "+newest, post)
		case k < 7:
			_, err = pool.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments ORDER BY score DESC NULLS LAST LIMIT 1)")
		case k < 8:
			_, err = pool.Exec(ctx, "UPDATE comments SET hidden = NOT hidden, score = score + 7 WHERE id = "+newest, post)
		default:
			_, err = pool.Exec(ctx, "UPDATE comments SET post_id = $2 WHERE id = "+newest, post, 1+rng.Int64N(20))
		}
		return err
	})

	// The app has stopped: the columns must reach the truth and stay.
	const off = `
SELECT (SELECT count(*) FROM posts p CROSS JOIN LATERAL (
  SELECT max(c.at) FILTER (WHERE NOT c.hidden) AS n, min(c.score) AS l FROM comments c WHERE c.post_id = p.id) t
WHERE (p.newest, p.low_score) IS DISTINCT FROM (t.n, t.l)
  OR (SELECT top_score FROM site) IS DISTINCT FROM (SELECT max(score) FROM comments))
+ (SELECT count(*) FROM post_latest l FULL JOIN (SELECT post_id, max(at) AS n FROM comments GROUP BY post_id) c ON c.post_id = l.post_id
WHERE l.newest IS DISTINCT FROM c.n AND (l.post_id IS NOT NULL OR c.n IS NOT NULL))`
	c.settlesExact(off, "posts")
	t.Logf("exact after two SIGKILLs: %d comments", c.count("SELECT count(*) FROM comments"))
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
