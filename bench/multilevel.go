package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/config"
	"github.com/walcount/walcount/internal/setup"
)

// Section 12 (-only multi): a multi-level counter, likes →
// posts.likes_count → users.total_likes (posts.user_id over 1000 users),
// kept by walcount or by the app's two triggers (an AFTER INSERT trigger
// on likes that bumps the post, and an AFTER UPDATE OF likes_count trigger
// on posts that bumps its user), under the closed loop of section 1 (Zipf
// over 10k posts). Each configuration on a fresh cluster; walcount's both
// levels are verified at the end.
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
	for _, walcount := range []bool{false, true} {
		rs, err := runMultiLevelOnce(ctx, b, walcount)
		if err != nil {
			return "", err
		}
		out = append(out, rs...)
	}
	var s strings.Builder
	fmt.Fprintf(&s, "## 12. A multi-level counter\n\nlikes → `posts.likes_count` → `users.total_likes` (posts spread over %d users by `posts.user_id`, "+
		"`posts` with REPLICA IDENTITY FULL). Closed loop of single-row like inserts, Zipf over 10k posts, %d rounds of %s warm-up and %s measured, pooled, fresh cluster per configuration. "+
		"Triggers: AFTER INSERT on likes bumps the post, AFTER UPDATE OF likes_count on posts bumps its user. "+
		"walcount: the two counters of docs/configuration.md (Multi-level counters), both levels verified after the run.\n\n"+
		"| configuration | clients | likes/s | p50 ms | p99 ms | exact |\n|---|---:|---:|---:|---:|---|\n", multiUsers, b.rounds, b.warmup, b.measure)
	for _, r := range out {
		fmt.Fprintf(&s, "| %s | %d | %.0f | %.2f | %.2f | %s |\n", r.config, r.clients, r.res.tps(),
			float64(r.res.quantile(0.5).Microseconds())/1000, float64(r.res.quantile(0.99).Microseconds())/1000, r.exact)
	}
	s.WriteString("\n")
	return s.String(), nil
}

func runMultiLevelOnce(ctx context.Context, b *bench, walcount bool) ([]multiResult, error) {
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
	name := "triggers (two levels)"
	var wc *walcountProc
	if walcount {
		name = "walcount (two levels)"
		path := filepath.Join(b.tmp, fmt.Sprintf("multilevel-%d.yaml", time.Now().UnixNano()))
		if err := os.WriteFile(path, []byte(multiYAML), 0o600); err != nil {
			return nil, err
		}
		cfg, err := config.Load(path, func(string) (string, bool) { return "", false }, config.Overrides{})
		if err != nil {
			return nil, err
		}
		cfg.DatabaseURL, cfg.RedisURL = c.url, c.redis.URL()
		conn, err := pgx.Connect(ctx, c.url)
		if err != nil {
			return nil, err
		}
		_, err = setup.Run(ctx, conn, setup.Options{Config: cfg})
		conn.Close(context.Background())
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		if wc, err = startWalcount(b.bin, b.tmp, c, "--config", path); err != nil {
			return nil, err
		}
		defer func() { _ = wc.stop() }()
		if err := wc.waitMetrics(ctx); err != nil {
			return nil, err
		}
	} else if _, err := c.db.Exec(ctx, multiTriggerSQL); err != nil {
		return nil, fmt.Errorf("triggers: %w", err)
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
		// Level 2 applies what level 1's flush wrote one flush later.
		for range 2 {
			if err := c.caughtUp(ctx, 2*time.Minute); err != nil {
				return nil, err
			}
		}
		if err := wc.alive(); err != nil {
			return nil, err
		}
	}
	if err := c.verify(ctx); err != nil {
		exact = "no: " + err.Error()
	}
	var bad int64
	if err := c.db.QueryRow(ctx, `SELECT count(*) FROM users u LEFT JOIN (SELECT user_id, sum(likes_count) AS s FROM posts GROUP BY user_id) p
ON p.user_id = u.id WHERE u.total_likes <> coalesce(p.s, 0)`).Scan(&bad); err != nil {
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
