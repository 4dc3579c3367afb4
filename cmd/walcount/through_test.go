package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestThroughParentSurvivesKill9 runs the real binary on a counter
// through a parent (the scores of the votes on a user's live posts, in
// users.karma, through posts.creator_id), checks that walcount check
// finds nothing to fix once walcount setup made the via table, kills the
// daemon with SIGKILL twice while the app votes, changes votes, moves
// posts between users and soft-deletes and restores them, and checks
// the karma against SQL once a last daemon has caught up.
func TestThroughParentSurvivesKill9(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), `
CREATE TABLE users (id bigint PRIMARY KEY, karma bigint NOT NULL DEFAULT 0);
CREATE TABLE posts (id bigint PRIMARY KEY, creator_id bigint, deleted boolean NOT NULL DEFAULT false);
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL REFERENCES posts, score smallint NOT NULL);
ALTER TABLE votes REPLICA IDENTITY FULL;
CREATE INDEX ON votes (post_id);
INSERT INTO users (id) SELECT g FROM generate_series(1, 8) g;
INSERT INTO posts (id, creator_id) SELECT g, 1 + g % 8 FROM generate_series(1, 20) g;
INSERT INTO votes (post_id, score) SELECT 1 + g % 20, CASE WHEN g % 3 = 0 THEN -1 ELSE 1 END FROM generate_series(1, 200) g;`)
	path := c.writeConfig(`
counters:
  - name: user_karma
    source: votes
    key: post_id
    via: {table: posts, key: id, column: creator_id, where: {deleted: false}}
    target: users
    target_key: id
    column: karma
    sum: score
`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	// posts carries the parent's columns only in its key: check names
	// the fix, and setup applies it when asked.
	if code, out, _ := walcount(t, env, "check"); code == exitOK || !strings.Contains(out, "REPLICA IDENTITY") {
		t.Fatalf("check before setup: exit %d, want the replica identity of posts named:\n%s", code, out)
	}
	if code, _, _ := walcount(t, env, "setup", "--fix-replica-identity"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	if code, out, _ := walcount(t, env, "check"); code != exitOK || strings.Contains(out, "PROBLEM") {
		t.Fatalf("check after setup: exit %d, want nothing to fix:\n%s", code, out)
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
			_, err = pool.Exec(ctx, "INSERT INTO votes (post_id, score) VALUES ($1, $2)", post, []int{-1, 1, 1}[rng.IntN(3)])
		case k < 5:
			_, err = pool.Exec(ctx, "DELETE FROM votes WHERE id = (SELECT id FROM votes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post)
		case k < 6:
			_, err = pool.Exec(ctx, "UPDATE votes SET score = -score WHERE id = (SELECT id FROM votes WHERE post_id = $1 LIMIT 1)", post)
		case k < 8:
			var user any = 1 + rng.Int64N(8)
			if rng.IntN(6) == 0 {
				user = nil
			}
			_, err = pool.Exec(ctx, "UPDATE posts SET creator_id = $2 WHERE id = $1", post, user)
		default:
			_, err = pool.Exec(ctx, "UPDATE posts SET deleted = NOT deleted WHERE id = $1", post)
		}
		return err
	})

	const off = `
SELECT count(*) FROM users u WHERE u.karma <> (SELECT coalesce(sum(v.score), 0) FROM votes v JOIN posts p ON p.id = v.post_id WHERE p.creator_id = u.id AND NOT p.deleted)`
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// Which level is off: the via table against the votes and posts,
		// or the users against the via table.
		pool, err := pgxpool.New(context.Background(), c.db)
		if err != nil {
			return
		}
		defer pool.Close()
		for _, q := range []string{
			`SELECT 'via ' || v.parent_key || ': total ' || v.total || ' target ' || v.target || ' passes ' || v.passes || ', true ' ||
  coalesce((SELECT sum(score) FROM votes WHERE post_id = v.parent_key), 0) || ' ' || coalesce(p.creator_id, 0) || ' ' ||
  (CASE WHEN p.creator_id IS NOT NULL AND NOT p.deleted THEN 1 ELSE 0 END)
FROM walcount.via_user_karma v LEFT JOIN posts p ON p.id = v.parent_key
WHERE v.total <> coalesce((SELECT sum(score) FROM votes WHERE post_id = v.parent_key), 0) OR v.target <> coalesce(p.creator_id, 0)
   OR v.passes <> (CASE WHEN p.creator_id IS NOT NULL AND NOT p.deleted THEN 1 ELSE 0 END)`,
			`SELECT 'user ' || u.id || ': karma ' || u.karma || ', via sum ' || coalesce((SELECT sum(total) FROM walcount.via_user_karma WHERE target = u.id AND passes = 1), 0)
FROM users u WHERE u.karma <> coalesce((SELECT sum(total) FROM walcount.via_user_karma WHERE target = u.id AND passes = 1), 0)`,
		} {
			rows, err := pool.Query(context.Background(), q)
			if err != nil {
				t.Logf("diagnose: %v", err)
				continue
			}
			for rows.Next() {
				var line string
				if rows.Scan(&line) == nil {
					t.Log(line)
				}
			}
			rows.Close()
		}
	})
	c.settlesExact(off, "users")
	t.Logf("exact after two SIGKILLs: %d votes", c.count("SELECT count(*) FROM votes"))
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
