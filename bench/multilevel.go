package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Section 12 (-only multi): a multi-level counter, likes →
// posts.likes_count → users.total_likes (posts.user_id over 1000 users),
// kept by walcount or by the app's two triggers (an AFTER INSERT trigger
// on likes that bumps the post, and an AFTER UPDATE OF likes_count trigger
// on posts that bumps its user), and the same users.total_likes through
// posts with no posts.likes_count (a counter with via, or the app's
// triggers that look the post's user up on every like), under the closed
// loop of section 1 (Zipf over 10k posts). Each configuration on a fresh
// cluster; walcount's counters are verified at the end.
const multiUsers = 1000

const multiSQL = `
ALTER TABLE posts ADD COLUMN user_id bigint;
UPDATE posts SET user_id = id % 1000;
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE TABLE users (id bigint PRIMARY KEY, total_likes bigint NOT NULL DEFAULT 0);
INSERT INTO users (id) SELECT g FROM generate_series(0, 999) g;
`

const multiTriggerSQL = triggerSQL + `
CREATE FUNCTION total_likes_up() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE users SET total_likes = total_likes + NEW.likes_count - OLD.likes_count WHERE id = NEW.user_id;
  RETURN NULL;
END $$;
CREATE TRIGGER total_likes_up AFTER UPDATE OF likes_count ON posts FOR EACH ROW
  WHEN (NEW.likes_count <> OLD.likes_count) EXECUTE FUNCTION total_likes_up();
`

// viaTriggerSQL keeps users.total_likes as the likes of each user's posts
// with no posts.likes_count in between: the app's triggers query the
// post's user on every like, and move a post's likes when it changes
// hands.
const viaTriggerSQL = `
CREATE FUNCTION user_likes_through() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    UPDATE users SET total_likes = total_likes + 1 WHERE id = (SELECT user_id FROM posts WHERE id = NEW.post_id);
  ELSE
    UPDATE users SET total_likes = total_likes - 1 WHERE id = (SELECT user_id FROM posts WHERE id = OLD.post_id);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER user_likes_through AFTER INSERT OR DELETE ON likes FOR EACH ROW EXECUTE FUNCTION user_likes_through();
CREATE FUNCTION post_moves_likes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  SELECT count(*) INTO n FROM likes WHERE post_id = NEW.id;
  UPDATE users SET total_likes = total_likes - n WHERE id = OLD.user_id;
  UPDATE users SET total_likes = total_likes + n WHERE id = NEW.user_id;
  RETURN NULL;
END $$;
CREATE TRIGGER post_moves_likes AFTER UPDATE OF user_id ON posts FOR EACH ROW
  WHEN (NEW.user_id IS DISTINCT FROM OLD.user_id) EXECUTE FUNCTION post_moves_likes();
`

// viaYAML is the same aggregate as a counter through a parent.
const viaYAML = `counters:
  - {name: user_likes, source: likes, key: post_id, via: {table: posts, key: id, column: user_id}, target: users, target_key: id, column: total_likes}
`

// The configurations of section 12.
type multiMode int

const (
	multiTriggers multiMode = iota
	multiWalcount
	viaTriggers
	viaWalcount
)

func (m multiMode) String() string {
	return [...]string{"triggers (two levels)", "walcount (two levels)", "triggers (through posts)", "walcount (via posts)"}[m]
}

func (m multiMode) walcount() bool { return m == multiWalcount || m == viaWalcount }

const multiYAML = `counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: user_likes, source: posts, key: user_id, target: users, target_key: id, column: total_likes, sum: likes_count}
`

type multiResult struct {
	config  string
	clients int
	res     runResult
	exact   string
}

func runMultiLevel(ctx context.Context, b *bench) (string, error) {
	var out []multiResult
	for _, mode := range []multiMode{multiTriggers, multiWalcount, viaTriggers, viaWalcount} {
		rs, err := runMultiLevelOnce(ctx, b, mode)
		if err != nil {
			return "", err
		}
		out = append(out, rs...)
	}
	var s strings.Builder
	fmt.Fprintf(&s, "## 12. A multi-level counter, and one through a parent\n\nlikes → `posts.likes_count` → `users.total_likes` (posts spread over %d users by `posts.user_id`, "+
		"`posts` with REPLICA IDENTITY FULL). Closed loop of single-row like inserts, Zipf over 10k posts, %d rounds of %s warm-up and %s measured, pooled, fresh cluster per configuration. "+
		"Two levels, triggers: AFTER INSERT on likes bumps the post, AFTER UPDATE OF likes_count on posts bumps its user; "+
		"walcount: the two counters of docs/configuration.md (Multi-level counters), both levels verified after the run. "+
		"Through posts (no posts.likes_count), triggers: AFTER INSERT OR DELETE on likes bumps the user its post's user_id names (a query of posts in every like), AFTER UPDATE OF user_id on posts moves the post's likes; "+
		"walcount: one counter with via (docs/configuration.md, Keys through a parent row), verified against the likes of each user's posts.\n\n"+
		"| configuration | clients | likes/s | p50 ms | p99 ms | exact |\n|---|---:|---:|---:|---:|---|\n", multiUsers, b.rounds, b.warmup, b.measure)
	for _, r := range out {
		fmt.Fprintf(&s, "| %s | %d | %.0f | %.2f | %.2f | %s |\n", r.config, r.clients, r.res.tps(),
			float64(r.res.quantile(0.5).Microseconds())/1000, float64(r.res.quantile(0.99).Microseconds())/1000, r.exact)
	}
	s.WriteString("\n")
	return s.String(), nil
}

func runMultiLevelOnce(ctx context.Context, b *bench, mode multiMode) ([]multiResult, error) {
	walcount := mode.walcount()
	via := mode == viaTriggers || mode == viaWalcount
	c, err := newCluster(ctx, zipfPosts)
	if err != nil {
		return nil, err
	}
	defer c.close()
	if _, err := c.db.Exec(ctx, multiSQL); err != nil {
		return nil, fmt.Errorf("multi-level schema: %w", err)
	}
	if _, err := c.db.Exec(ctx, "VACUUM ANALYZE posts, users"); err != nil {
		return nil, err
	}
	name := mode.String()
	var wc *walcountProc
	if walcount {
		yaml := multiYAML
		if via {
			yaml = viaYAML
		}
		path := filepath.Join(b.tmp, fmt.Sprintf("multilevel-%d.yaml", time.Now().UnixNano()))
		if err := c.setupYAML(ctx, path, yaml); err != nil {
			return nil, err
		}
		if wc, err = startWalcount(b.bin, b.tmp, c, "--config", path); err != nil {
			return nil, err
		}
		defer func() { _ = wc.stop() }()
		if err := wc.waitMetrics(ctx); err != nil {
			return nil, err
		}
		// The backfill (for via: a via row per post) before the load,
		// so that the rounds measure the steady state.
		if err := c.backfilled(ctx, 5*time.Minute); err != nil {
			return nil, err
		}
	} else {
		sql := multiTriggerSQL
		if via {
			sql = viaTriggerSQL
		}
		if _, err := c.db.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("triggers: %w", err)
		}
	}
	var out []multiResult
	for _, clients := range b.clientCounts {
		b.logf("   %s, %d clients", name, clients)
		var res runResult
		for range b.rounds {
			r, err := closedLoop(ctx, c.url, clients, workloads[1], styleInsert, b.warmup, b.measure)
			if err != nil {
				return nil, err
			}
			res = res.merge(r)
		}
		out = append(out, multiResult{config: name, clients: clients, res: res, exact: "-"})
	}
	exact := "yes"
	if walcount {
		// Level 2 applies what level 1's flush wrote one flush later;
		// settled, not only caught up: a level 1 batch applied in pieces
		// after W passed the first mark writes posts after the second.
		for range 2 {
			if err := c.settled(ctx, 2*time.Minute); err != nil {
				return nil, err
			}
		}
		if err := wc.alive(); err != nil {
			return nil, err
		}
	}
	users := `SELECT count(*) FROM users u LEFT JOIN (SELECT user_id, sum(likes_count) AS s FROM posts GROUP BY user_id) p
ON p.user_id = u.id WHERE u.total_likes <> coalesce(p.s, 0)`
	if via {
		// No posts.likes_count: each user against the likes of its posts.
		users = `SELECT count(*) FROM users u LEFT JOIN (SELECT p.user_id, count(*) AS s FROM likes l JOIN posts p ON p.id = l.post_id GROUP BY p.user_id) p
ON p.user_id = u.id WHERE u.total_likes <> coalesce(p.s, 0)`
	} else if err := c.verify(ctx); err != nil {
		exact = "no: " + err.Error()
	}
	var bad int64
	if err := c.db.QueryRow(ctx, users).Scan(&bad); err != nil {
		return nil, err
	}
	if bad > 0 && exact == "yes" {
		exact = fmt.Sprintf("no: %d users off", bad)
	}
	for i := range out {
		out[i].exact = exact
	}
	return out, nil
}

// backfilled waits until walcount has no reconciliation run pending or
// running, and at least one has finished: the backfill of new counters.
func (c *cluster) backfilled(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var open, done int64
		err := c.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status IN ('pending', 'running')), count(*) FILTER (WHERE status = 'done')
FROM walcount.reconcile_runs`).Scan(&open, &done)
		if err != nil {
			return fmt.Errorf("backfill: %w", err)
		}
		if open == 0 && done > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("backfill: not done after %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
