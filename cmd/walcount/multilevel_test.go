package main

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestMultiLevelSurvivesKill9 runs the real binary on a multi-level
// counter (likes → posts.likes_count → users.total_likes by
// posts.user_id), kills it with SIGKILL twice while the app likes, unlikes,
// moves likes between posts and moves posts between users, and checks both
// levels against SQL once a last daemon has caught up.
func TestMultiLevelSurvivesKill9(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{PostsColumns: "user_id bigint", Index: true})+`
CREATE TABLE users (id bigint PRIMARY KEY, total_likes bigint NOT NULL DEFAULT 0);
ALTER TABLE posts REPLICA IDENTITY FULL;
ALTER TABLE likes ADD FOREIGN KEY (post_id) REFERENCES posts;
INSERT INTO users (id) SELECT g FROM generate_series(1, 8) g;
INSERT INTO posts (id, user_id) SELECT g, 1 + g % 8 FROM generate_series(1, 20) g;
INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 200) g;`)
	path := c.writeConfig(`
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: user_likes, source: posts, key: user_id, target: users, target_key: id, column: total_likes, sum: likes_count}
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
		var err error
		switch k := rng.IntN(10); {
		case k < 4:
			_, err = pool.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1)", post)
		case k < 6:
			_, err = pool.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post)
		case k < 8:
			_, err = pool.Exec(ctx, "UPDATE likes SET post_id = $2 WHERE id = (SELECT id FROM likes WHERE post_id = $1 LIMIT 1)", post, 1+rng.Int64N(20))
		default:
			var user any = 1 + rng.Int64N(8)
			if rng.IntN(6) == 0 {
				user = nil
			}
			_, err = pool.Exec(ctx, "UPDATE posts SET user_id = $2 WHERE id = $1", post, user)
		}
		return err
	})

	// The app has stopped: both levels must reach the truth and stay.
	const off = `
SELECT (SELECT count(*) FROM posts p WHERE p.likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id))
     + (SELECT count(*) FROM users u WHERE u.total_likes <> (SELECT count(*) FROM likes l JOIN posts p ON p.id = l.post_id WHERE p.user_id = u.id))`
	c.settlesExact(off, "posts and users")
	t.Logf("exact after two SIGKILLs: %d likes", c.count("SELECT count(*) FROM likes"))
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
