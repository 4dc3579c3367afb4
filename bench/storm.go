package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/stats"
)

// Section 14 (-only storm): the first storm after a backfill (issue 35
// §2). An app-shaped schema (posts, comments, votes on posts, users, one
// site row) whose thirteen counter columns the app's own triggers keep
// exact; a light load of the app's writes runs while walcount is set up,
// the triggers are dropped and walcount runs its backfill; then storms of
// votes and comments, the first right after the backfill, each followed by
// a wait until walcount has applied it all.
const (
	stormClients = 8
	stormRounds  = 3
	// stormLightShare: the load during the cutover and the backfill is
	// the storm's rate divided by this.
	stormLightShare = 4
	// stormCutoverPause is how long the light load runs between the
	// steps of the cutover (before setup, between setup and the drop),
	// so that changes fall in each stretch.
	stormCutoverPause = time.Second
	// stormSettle bounds the wait for a round's changes to be applied.
	stormSettle = 5 * time.Minute
)

// stormSize is the section's data and load.
type stormSize struct {
	posts, users, votes, comments int64
	rate                          float64 // transactions/s of a storm
	round                         time.Duration
}

var (
	fullStorm  = stormSize{posts: 50_000, users: 5_000, votes: 300_000, comments: 100_000, rate: 800, round: 45 * time.Second}
	quickStorm = stormSize{posts: 5_000, users: 500, votes: 30_000, comments: 10_000, rate: 400, round: 10 * time.Second}
)

// stormSchemaSQL is the app. Post 0 is the probe's; 1 in 50 posts is
// deleted, and so are 1 in 20 of the pre-filled comments.
const stormSchemaSQL = `
CREATE TABLE site (id int PRIMARY KEY, posts bigint NOT NULL DEFAULT 0, comments bigint NOT NULL DEFAULT 0,
  votes bigint NOT NULL DEFAULT 0, score bigint NOT NULL DEFAULT 0);
CREATE TABLE users (id bigint PRIMARY KEY, posts bigint NOT NULL DEFAULT 0, comments bigint NOT NULL DEFAULT 0,
  karma bigint NOT NULL DEFAULT 0, replies bigint NOT NULL DEFAULT 0);
CREATE TABLE posts (id bigint PRIMARY KEY, creator_id bigint NOT NULL, deleted boolean NOT NULL DEFAULT false,
  votes bigint NOT NULL DEFAULT 0, score bigint NOT NULL DEFAULT 0, upvotes bigint NOT NULL DEFAULT 0,
  comments bigint NOT NULL DEFAULT 0, newest_comment_at timestamptz);
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, creator_id bigint NOT NULL,
  deleted boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE post_votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL, score int NOT NULL);
CREATE INDEX ON posts (creator_id);
CREATE INDEX ON comments (post_id);
CREATE INDEX ON comments (post_id, created_at) WHERE NOT deleted;
CREATE INDEX ON comments (creator_id);
CREATE INDEX ON post_votes (post_id);
ALTER TABLE posts REPLICA IDENTITY FULL;
ALTER TABLE comments REPLICA IDENTITY FULL;
ALTER TABLE post_votes REPLICA IDENTITY FULL;
`

// stormExactSQL sets every column from its source rows.
const stormExactSQL = `
UPDATE posts p SET votes = v.n, score = v.s, upvotes = v.u
  FROM (SELECT post_id, count(*) n, sum(score) s, count(*) FILTER (WHERE score = 1) u FROM post_votes GROUP BY post_id) v WHERE v.post_id = p.id;
UPDATE posts p SET comments = c.n, newest_comment_at = c.m
  FROM (SELECT post_id, count(*) n, max(created_at) m FROM comments WHERE NOT deleted GROUP BY post_id) c WHERE c.post_id = p.id;
UPDATE users u SET posts = x.n FROM (SELECT creator_id, count(*) n FROM posts WHERE NOT deleted GROUP BY creator_id) x WHERE x.creator_id = u.id;
UPDATE users u SET comments = x.n FROM (SELECT creator_id, count(*) n FROM comments WHERE NOT deleted GROUP BY creator_id) x WHERE x.creator_id = u.id;
UPDATE users u SET karma = x.s FROM (SELECT p.creator_id, sum(v.score) s FROM post_votes v JOIN posts p ON p.id = v.post_id
  WHERE NOT p.deleted GROUP BY p.creator_id) x WHERE x.creator_id = u.id;
UPDATE users u SET replies = x.n FROM (SELECT p.creator_id, count(*) n FROM comments c JOIN posts p ON p.id = c.post_id
  WHERE NOT c.deleted AND NOT p.deleted GROUP BY p.creator_id) x WHERE x.creator_id = u.id;
UPDATE site SET posts = (SELECT count(*) FROM posts WHERE NOT deleted), comments = (SELECT count(*) FROM comments WHERE NOT deleted),
  votes = (SELECT count(*) FROM post_votes), score = (SELECT coalesce(sum(score), 0) FROM posts);
`

// stormTriggerSQL is how the app kept its columns before walcount: every
// vote and comment updates its post, its users and the site row.
const stormTriggerSQL = `
CREATE FUNCTION app_vote() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r post_votes; sign int; c bigint; d boolean;
BEGIN
  IF TG_OP = 'INSERT' THEN r := NEW; sign := 1; ELSE r := OLD; sign := -1; END IF;
  UPDATE posts SET votes = votes + sign, score = score + sign * r.score, upvotes = upvotes + sign * (r.score = 1)::int
    WHERE id = r.post_id RETURNING creator_id, deleted INTO c, d;
  IF NOT d THEN UPDATE users SET karma = karma + sign * r.score WHERE id = c; END IF;
  UPDATE site SET votes = votes + sign, score = score + sign * r.score WHERE id = 1;
  RETURN NULL;
END $$;
CREATE TRIGGER app_vote AFTER INSERT OR DELETE ON post_votes FOR EACH ROW EXECUTE FUNCTION app_vote();
CREATE FUNCTION app_comment() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE sign int; c bigint; d boolean;
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NEW.deleted THEN RETURN NULL; END IF;
    sign := 1;
  ELSIF OLD.deleted = NEW.deleted THEN RETURN NULL;
  ELSIF NEW.deleted THEN sign := -1;
  ELSE sign := 1;
  END IF;
  UPDATE posts SET comments = comments + sign,
      newest_comment_at = (SELECT max(created_at) FROM comments WHERE post_id = NEW.post_id AND NOT deleted)
    WHERE id = NEW.post_id RETURNING creator_id, deleted INTO c, d;
  UPDATE users SET comments = comments + sign WHERE id = NEW.creator_id;
  IF NOT d THEN UPDATE users SET replies = replies + sign WHERE id = c; END IF;
  UPDATE site SET comments = comments + sign WHERE id = 1;
  RETURN NULL;
END $$;
CREATE TRIGGER app_comment AFTER INSERT OR UPDATE OF deleted ON comments FOR EACH ROW EXECUTE FUNCTION app_comment();
`

const stormDropTriggersSQL = `BEGIN;
DROP TRIGGER app_vote ON post_votes;
DROP TRIGGER app_comment ON comments;
COMMIT;`

// stormYAML is walcount's version of the triggers: counts, a filtered
// count, sums, a max, two counters through a parent (posts.creator_id),
// site totals with no key and a level-2 total over posts.score.
const stormYAML = `counters:
  - {name: post_votes, source: post_votes, key: post_id, target: posts, target_key: id, column: votes}
  - {name: post_score, source: post_votes, key: post_id, target: posts, target_key: id, column: score, sum: score}
  - {name: post_upvotes, source: post_votes, key: post_id, where: {score: 1}, target: posts, target_key: id, column: upvotes}
  - {name: post_comments, source: comments, key: post_id, where: {deleted: false}, target: posts, target_key: id, column: comments}
  - {name: post_newest_comment, source: comments, key: post_id, where: {deleted: false}, target: posts, target_key: id, column: newest_comment_at, max: created_at}
  - {name: user_posts, source: posts, key: creator_id, where: {deleted: false}, target: users, target_key: id, column: posts}
  - {name: user_comments, source: comments, key: creator_id, where: {deleted: false}, target: users, target_key: id, column: comments}
  - {name: user_karma, source: post_votes, key: post_id, via: {table: posts, key: id, column: creator_id, where: {deleted: false}}, target: users, target_key: id, column: karma, sum: score}
  - {name: user_replies, source: comments, key: post_id, where: {deleted: false}, via: {table: posts, key: id, column: creator_id, where: {deleted: false}}, target: users, target_key: id, column: replies}
  - {name: site_posts, source: posts, where: {deleted: false}, target: site, target_key: id, target_row: 1, column: posts}
  - {name: site_comments, source: comments, where: {deleted: false}, target: site, target_key: id, target_row: 1, column: comments}
  - {name: site_votes, source: post_votes, target: site, target_key: id, target_row: 1, column: votes}
  - {name: site_score, source: posts, target: site, target_key: id, target_row: 1, column: score, sum: score}
`

// stormChecks compare the columns (have) with their source rows (want),
// row by row (id).
var stormChecks = []struct{ what, from, id, have, want string }{
	{"posts.votes, score, upvotes", `posts p LEFT JOIN (SELECT post_id, count(*) n, sum(score) s, count(*) FILTER (WHERE score = 1) u
FROM post_votes GROUP BY post_id) v ON v.post_id = p.id`, "p.id", "p.votes, p.score, p.upvotes", "coalesce(v.n, 0), coalesce(v.s, 0), coalesce(v.u, 0)"},
	{"posts.comments, newest_comment_at", `posts p LEFT JOIN (SELECT post_id, count(*) n, max(created_at) m
FROM comments WHERE NOT deleted GROUP BY post_id) c ON c.post_id = p.id`, "p.id", "p.comments, p.newest_comment_at", "coalesce(c.n, 0), c.m"},
	{"users.posts, comments, karma, replies", `users u
LEFT JOIN (SELECT creator_id, count(*) n FROM posts WHERE NOT deleted GROUP BY creator_id) p ON p.creator_id = u.id
LEFT JOIN (SELECT creator_id, count(*) n FROM comments WHERE NOT deleted GROUP BY creator_id) c ON c.creator_id = u.id
LEFT JOIN (SELECT p.creator_id, sum(v.score) s FROM post_votes v JOIN posts p ON p.id = v.post_id WHERE NOT p.deleted GROUP BY p.creator_id) k ON k.creator_id = u.id
LEFT JOIN (SELECT p.creator_id, count(*) n FROM comments c JOIN posts p ON p.id = c.post_id WHERE NOT c.deleted AND NOT p.deleted GROUP BY p.creator_id) r ON r.creator_id = u.id`,
		"u.id", "u.posts, u.comments, u.karma, u.replies", "coalesce(p.n, 0), coalesce(c.n, 0), coalesce(k.s, 0), coalesce(r.n, 0)"},
	{"site", "site", "id", "posts, comments, votes, score",
		"(SELECT count(*) FROM posts WHERE NOT deleted), (SELECT count(*) FROM comments WHERE NOT deleted), (SELECT count(*) FROM post_votes), (SELECT coalesce(sum(score), 0) FROM posts)"},
}

// stormRound is one storm's figures.
type stormRound struct {
	txns                   int64
	window                 time.Duration // the storm
	catchUp                time.Duration // from the storm's end until everything was applied
	lagP50, lagP99, lagMax float64       // walcount_apply_lag_seconds, the round's transactions
	probes                 []time.Duration
	flushes, pieces        float64
	log                    logCounts // what walcount's log said of the round's flushes
	cpu                    time.Duration
}

// stormResult is section 14.
type stormResult struct {
	size                   stormSize
	rows                   int64 // source rows after the pre-fill
	build                  time.Duration
	backfill               time.Duration // walcount run → every backfill run done
	backfillKeys, backfix  int64         // keys checked, keys corrected
	backfillCPU            time.Duration
	backfillLog            logCounts
	lightTxns              int64
	rounds                 []stormRound
	exact                  bool
	loadErrors, deadlocked int64
}

// runStorm runs section 14.
func runStorm(ctx context.Context, b *bench) (*stormResult, error) {
	size := fullStorm
	if b.quick {
		size = quickStorm
	}
	if b.stormSize != nil {
		size = *b.stormSize
	}
	if b.stormRate > 0 {
		size.rate = b.stormRate
	}
	if b.stormRound > 0 {
		size.round = b.stormRound
	}
	res := &stormResult{size: size}
	c, err := newBareCluster(ctx)
	if err != nil {
		return nil, err
	}
	defer c.close()
	began := time.Now()
	if err := buildStorm(ctx, c, size, &res.rows); err != nil {
		return nil, err
	}
	res.build = time.Since(began)
	b.logf("  %d posts, %d users, %d source rows built in %s", size.posts, size.users, res.rows, res.build.Round(time.Second))
	path := filepath.Join(b.tmp, fmt.Sprintf("storm-%d.yaml", time.Now().UnixNano()))
	wc, err := stormCutover(ctx, b, c, path, res)
	if err != nil {
		return res, err
	}
	defer func() { _ = wc.stop() }()
	for i := range stormRounds {
		r, err := stormOnce(ctx, b, c, wc, size, res)
		if err != nil {
			return res, err
		}
		res.rounds = append(res.rounds, r)
		b.logf("  round %d: %d txns in %s (%.0f/s), caught up %s after; apply lag p50 %.2fs p99 %.2fs max %.2fs; probe p99 %s; %.0f flushes, %.0f pieces, %d staged (%d keys, pace median / max %s), %d slow; walcount CPU %s",
			i+1, r.txns, r.window.Round(time.Millisecond), float64(r.txns)/r.window.Seconds(), r.catchUp.Round(time.Millisecond),
			r.lagP50, r.lagP99, r.lagMax, stats.Quantile(r.probes, 0.99), r.flushes, r.pieces, r.log.staged, r.log.keys, r.log.pace(), r.log.slow, r.cpu)
	}
	// Twice: the counters through a parent and site_score are a level
	// above another (the via tables, posts.score), which they follow one
	// flush later.
	for range 2 {
		if err := c.settled(ctx, stormSettle); err != nil {
			return res, err
		}
	}
	if err := wc.alive(); err != nil {
		return res, err
	}
	if err := verifyStorm(ctx, c); err != nil {
		// Again after two more flushes, to tell a column that trails
		// from one that stays off (a level above a level above).
		b.logf("  not exact: %v", err)
		for range 2 {
			if err := c.settled(ctx, stormSettle); err != nil {
				return res, err
			}
		}
		if err2 := verifyStorm(ctx, c); err2 != nil {
			return res, fmt.Errorf("still, after two more flushes: %w", err2)
		}
		return res, fmt.Errorf("exact only after two more flushes: %w", err)
	}
	res.exact = true
	return res, nil
}

// buildStorm creates the app, fills it (votes and comments skewed to the
// first posts), sets its columns exact and creates its triggers.
func buildStorm(ctx context.Context, c *cluster, s stormSize, rows *int64) error {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, q := range []string{
		stormSchemaSQL,
		`SET synchronous_commit = off`,
		`INSERT INTO site (id) VALUES (1)`,
		fmt.Sprintf(`INSERT INTO users (id) SELECT g FROM generate_series(1, %d) g`, s.users),
		fmt.Sprintf(`INSERT INTO posts (id, creator_id, deleted) SELECT g, 1 + (g * 7919) %% %d, g %% 50 = 49 FROM generate_series(0, %d) g`, s.users, s.posts),
		fmt.Sprintf(`INSERT INTO post_votes (post_id, user_id, score) SELECT 1 + floor(%d * random() ^ 3)::bigint, 1 + floor(random() * %d)::bigint,
  CASE WHEN random() < 0.8 THEN 1 ELSE -1 END FROM generate_series(1, %d)`, s.posts, s.users, s.votes),
		fmt.Sprintf(`INSERT INTO comments (post_id, creator_id, deleted, created_at) SELECT 1 + floor(%d * random() ^ 3)::bigint, 1 + floor(random() * %d)::bigint,
  random() < 0.05, now() - random() * interval '365 days' FROM generate_series(1, %d)`, s.posts, s.users, s.comments),
		stormExactSQL,
		stormTriggerSQL,
		`VACUUM (ANALYZE) site, users, posts, comments, post_votes`,
		`CHECKPOINT`,
		`RESET synchronous_commit`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("build the storm's app: %s: %w", strings.SplitN(strings.TrimSpace(q), "\n", 2)[0], err)
		}
	}
	if err := verifyStorm(ctx, c); err != nil {
		return fmt.Errorf("before walcount: %w", err)
	}
	return c.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM posts) + (SELECT count(*) FROM comments) + (SELECT count(*) FROM post_votes)`).Scan(rows)
}

// verifyStorm checks every column against its source rows; when rows
// are off it names the first few, with their columns and the truth.
func verifyStorm(ctx context.Context, c *cluster) error {
	var off []string
	for _, ch := range stormChecks {
		q := fmt.Sprintf(`SELECT %s::text, ROW(%s)::text, ROW(%s)::text FROM %s WHERE (%s) IS DISTINCT FROM (%s) ORDER BY 1`,
			ch.id, ch.have, ch.want, ch.from, ch.have, ch.want)
		rows, err := c.db.Query(ctx, q)
		if err != nil {
			return fmt.Errorf("verify %s: %w", ch.what, err)
		}
		var first []string
		n := 0
		for rows.Next() {
			var id, have, want string
			if err := rows.Scan(&id, &have, &want); err != nil {
				rows.Close()
				return fmt.Errorf("verify %s: %w", ch.what, err)
			}
			if n++; n <= 5 {
				first = append(first, fmt.Sprintf("%s: %s, truth %s", id, have, want))
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("verify %s: %w", ch.what, err)
		}
		if n > 0 {
			off = append(off, fmt.Sprintf("%s: %d rows off (%s)", ch.what, n, strings.Join(first, "; ")))
		}
	}
	if len(off) > 0 {
		var carried, dirty int64
		_ = c.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM walcount.carried), (SELECT count(*) FROM walcount.dirty)`).Scan(&carried, &dirty)
		return fmt.Errorf("%s; %d keys carried, %d dirty marks: %w", strings.Join(off, "; "), carried, dirty, errMismatch)
	}
	return nil
}

// stormCutover runs docs/cutover.md's steps with the light load running:
// setup with the triggers in place, the drop, walcount run; it returns
// once the backfill is done, with the light load stopped.
func stormCutover(ctx context.Context, b *bench, c *cluster, path string, res *stormResult) (*walcountProc, error) {
	lctx, stopLight := context.WithCancel(ctx)
	defer stopLight()
	light := startStormLoad(lctx, c.url, stormClients, res.size.rate/stormLightShare, res.size, 1)
	if err := pause(ctx, stormCutoverPause); err != nil {
		return nil, err
	}
	if err := c.setupYAML(ctx, path, stormYAML); err != nil {
		return nil, err
	}
	if err := pause(ctx, stormCutoverPause); err != nil {
		return nil, err
	}
	if _, err := c.db.Exec(ctx, stormDropTriggersSQL); err != nil {
		return nil, fmt.Errorf("drop the app's triggers: %w", err)
	}
	wc, err := startReady(ctx, b, c, "--config", path, "--log-level", "info")
	if err != nil {
		return nil, err
	}
	if err := c.backfilled(ctx, 30*time.Minute); err != nil {
		_ = wc.stop()
		return nil, err
	}
	res.backfill = time.Since(wc.started)
	stopLight()
	lr := light.wait()
	res.lightTxns, res.loadErrors, res.deadlocked = lr.txns, lr.errors, lr.deadlocked
	if lr.err != nil {
		_ = wc.stop()
		return nil, lr.err
	}
	u, err := wc.usage()
	if err != nil {
		_ = wc.stop()
		return nil, err
	}
	res.backfillCPU = u.cpu
	if err := c.db.QueryRow(ctx, `SELECT coalesce(sum(keys_checked), 0), coalesce(sum(corrected), 0) FROM walcount.reconcile_runs WHERE status = 'done'`).Scan(&res.backfillKeys, &res.backfix); err != nil {
		_ = wc.stop()
		return nil, err
	}
	if res.backfillLog, err = readLog(wc.logPath, 0); err != nil {
		_ = wc.stop()
		return nil, err
	}
	b.logf("  backfill under %.0f txns/s: %d keys checked, %d corrected, in %s; walcount CPU %s; %d batches staged (pace median / max %s)",
		res.size.rate/stormLightShare, res.backfillKeys, res.backfix, res.backfill.Round(time.Millisecond), res.backfillCPU, res.backfillLog.staged, res.backfillLog.pace())
	return wc, nil
}

// stormOnce runs one storm and waits until walcount applied it.
func stormOnce(ctx context.Context, b *bench, c *cluster, wc *walcountProc, s stormSize, res *stormResult) (stormRound, error) {
	var r stormRound
	fams, err := wc.scrape(ctx)
	if err != nil {
		return r, err
	}
	lag0, flushes0, pieces0 := lagBuckets(fams), metricValue(fams, "walcount_flushes_total"), metricValue(fams, "walcount_flush_pieces_total")
	u0, err := wc.usage()
	if err != nil {
		return r, err
	}
	logFrom := logSize(wc.logPath)
	pctx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	pr := &prober{c: c, insert: `INSERT INTO post_votes (post_id, user_id, score) VALUES ($1, $2, 1)`, read: `SELECT votes FROM posts WHERE id = $1`}
	var pwg sync.WaitGroup
	pwg.Go(func() { pr.run(pctx) })

	start := time.Now()
	pr.setWindow(start)
	lctx, stopLoad := context.WithTimeout(ctx, s.round)
	load := startStormLoad(lctx, c.url, stormClients, s.rate, s, uint64(len(res.rounds))+2)
	lr := load.wait()
	stopLoad()
	end := time.Now()
	pr.setWindowEnd(end)
	r.window = end.Sub(start)
	res.loadErrors += lr.errors
	res.deadlocked += lr.deadlocked
	if lr.err != nil {
		return r, lr.err
	}
	r.txns = lr.txns
	if err := c.settled(ctx, stormSettle); err != nil {
		return r, err
	}
	r.catchUp = time.Since(end)
	stopProbe()
	pwg.Wait()
	u1, err := wc.usage()
	if err != nil {
		return r, err
	}
	if fams, err = wc.scrape(ctx); err != nil {
		return r, err
	}
	win := subBuckets(lagBuckets(fams), lag0)
	r.lagP50, r.lagP99, r.lagMax = histQuantile(0.5, win), histQuantile(0.99, win), bucketBound(1, win)
	r.flushes = metricValue(fams, "walcount_flushes_total") - flushes0
	r.pieces = metricValue(fams, "walcount_flush_pieces_total") - pieces0
	r.probes = pr.lags()
	r.cpu = u1.cpu - u0.cpu
	if r.log, err = readLog(wc.logPath, logFrom); err != nil {
		return r, err
	}
	return r, wc.alive()
}

// logSize returns the size of walcount's log so far.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logCounts is what walcount's log says of the flushes: the batches
// staged in walcount.carried, their keys and the pace the flush knew when
// it staged them (per_key_seconds, sorted; none from a walcount that does
// not log it), and the flushes that took longer than flush_lock_time.
type logCounts struct {
	staged, keys, slow int64
	perKey             []time.Duration
}

// readLog reads walcount's JSON log from offset.
func readLog(path string, from int64) (logCounts, error) {
	var lc logCounts
	f, err := os.Open(path)
	if err != nil {
		return lc, err
	}
	defer f.Close()
	if _, err := f.Seek(from, 0); err != nil {
		return lc, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.Contains(line, []byte("staged a big batch")):
			lc.staged++
			var l struct {
				Keys   int64    `json:"keys"`
				PerKey *float64 `json:"per_key_seconds"`
			}
			if json.Unmarshal(line, &l) == nil {
				lc.keys += l.Keys
				if l.PerKey != nil {
					lc.perKey = append(lc.perKey, time.Duration(*l.PerKey*float64(time.Second)))
				}
			}
		case bytes.Contains(line, []byte("took longer than flush_lock_time")):
			lc.slow++
		}
	}
	slices.Sort(lc.perKey)
	return lc, sc.Err()
}

// pace prints the median and the largest pace of the staged batches.
func (lc logCounts) pace() string {
	if len(lc.perKey) == 0 {
		return "–"
	}
	return fmt.Sprintf("%s / %s", lc.perKey[len(lc.perKey)/2].Round(time.Microsecond), lc.perKey[len(lc.perKey)-1].Round(time.Microsecond))
}

// stormLoad is the app's writes: clients paced to a rate in all, each
// transaction one of a vote on a post (60%), the removal of one of the
// client's votes (10%), a comment (25%) or the soft delete of one of the
// client's comments (5%), on posts drawn by Zipf over the posts.
type stormLoad struct {
	done chan struct{}
	res  loadResult
}

type loadResult struct {
	txns, errors, deadlocked int64
	err                      error
}

func startStormLoad(ctx context.Context, url string, clients int, rate float64, s stormSize, seed uint64) *stormLoad {
	l := &stormLoad{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.res = runStormLoad(ctx, url, clients, rate, s, seed)
	}()
	return l
}

func (l *stormLoad) wait() loadResult {
	<-l.done
	return l.res
}

func runStormLoad(ctx context.Context, url string, clients int, rate float64, s stormSize, seed uint64) loadResult {
	conns, closeAll, err := connectAll(ctx, url, clients)
	if err != nil {
		return loadResult{err: err}
	}
	defer closeAll()
	results := make([]loadResult, clients)
	paced(ctx, clients, rate, func(i int) func() bool {
		cl := &stormClient{conn: conns[i], s: s, rng: rand.New(rand.NewPCG(seed, uint64(i)))}
		cl.zipf = rand.NewZipf(cl.rng, zipfS, 1, uint64(s.posts-1))
		return func() bool {
			err := cl.one(context.WithoutCancel(ctx))
			var pe *pgconn.PgError
			switch {
			case err == nil:
				results[i].txns++
			case errors.As(err, &pe) && pe.Code == "40P01":
				// Only the app's triggers deadlock (two users' rows
				// in either order): the transaction is lost, as an
				// app's would be, and the columns stay exact.
				results[i].deadlocked++
			default:
				results[i].errors++
				results[i].err = fmt.Errorf("storm client: %w", err)
				return false
			}
			return true
		}
	})
	var out loadResult
	for _, r := range results {
		out.txns += r.txns
		out.errors += r.errors
		out.deadlocked += r.deadlocked
		if out.err == nil {
			out.err = r.err
		}
	}
	return out
}

// stormClient is one client of stormLoad, with the votes and comments it
// wrote (the last few hundred) to take back.
type stormClient struct {
	conn            *pgx.Conn
	s               stormSize
	rng             *rand.Rand
	zipf            *rand.Zipf
	votes, comments []int64
}

const stormKeep = 500

func (cl *stormClient) one(ctx context.Context) error {
	post := 1 + int64(cl.zipf.Uint64())
	user := 1 + cl.rng.Int64N(cl.s.users)
	switch p := cl.rng.Float64(); {
	case p < 0.10 && len(cl.votes) > 0:
		id := cl.votes[len(cl.votes)-1]
		cl.votes = cl.votes[:len(cl.votes)-1]
		_, err := cl.conn.Exec(ctx, `DELETE FROM post_votes WHERE id = $1`, id)
		return err
	case p < 0.15 && len(cl.comments) > 0:
		id := cl.comments[len(cl.comments)-1]
		cl.comments = cl.comments[:len(cl.comments)-1]
		_, err := cl.conn.Exec(ctx, `UPDATE comments SET deleted = true WHERE id = $1`, id)
		return err
	case p < 0.40:
		var id int64
		if err := cl.conn.QueryRow(ctx, `INSERT INTO comments (post_id, creator_id) VALUES ($1, $2) RETURNING id`, post, user).Scan(&id); err != nil {
			return err
		}
		cl.comments = keepLast(append(cl.comments, id))
		return nil
	default:
		score := 1
		if cl.rng.Float64() < 0.2 {
			score = -1
		}
		var id int64
		if err := cl.conn.QueryRow(ctx, `INSERT INTO post_votes (post_id, user_id, score) VALUES ($1, $2, $3) RETURNING id`, post, user, score).Scan(&id); err != nil {
			return err
		}
		cl.votes = keepLast(append(cl.votes, id))
		return nil
	}
}

func keepLast(ids []int64) []int64 {
	if len(ids) > stormKeep {
		return append(ids[:0], ids[len(ids)-stormKeep:]...)
	}
	return ids
}

// stormSection writes section 14.
func stormSection(x *stormResult) string {
	var b strings.Builder
	s := x.size
	fmt.Fprintf(&b, "## 14. The first storm after a backfill\n\n")
	fmt.Fprintf(&b, "An app's posts (%s, 1 in 50 deleted), users (%s), votes on posts and comments (%s source rows in all, skewed to the first posts), "+
		"with thirteen columns kept exact by the app's triggers: per post votes, score, upvotes (filtered), live comments, newest comment (a max); "+
		"per user posts, comments, karma and replies (the last two through posts.creator_id, `via`); the site row's posts, comments, votes and score "+
		"(no key, the score over `posts.score`, a second level). "+
		"A light load (%d clients, %.0f txns/s in all) runs through docs/cutover.md's steps: setup with the triggers in place, the drop, `walcount run`, "+
		"until its backfill is done. Then %d storms of %s, %d clients paced to %.0f txns/s in all (60%% votes, 10%% vote removals, 25%% comments, 5%% comment soft deletes, "+
		"Zipf over the posts), the first right after the backfill; after each the load stops until walcount has applied it all (catch-up). "+
		"Apply lag is walcount_apply_lag_seconds over the round's transactions; the probe times a vote on post 0 from commit until `posts.votes` shows it; "+
		"staged batches are the flushes that copied their batch to walcount.carried and applied it in pieces, with the flush's pace (its time per key) when it staged them, "+
		"and slow flushes those that took longer than flush_lock_time, rolled back and went to pieces (walcount's log).\n\n",
		thousands(float64(s.posts)), thousands(float64(s.users)), thousands(float64(x.rows)),
		stormClients, s.rate/stormLightShare, stormRounds, s.round, stormClients, s.rate)
	fmt.Fprintf(&b, "Backfill: %s keys checked, %s corrected, in %s under the light load (%s transactions); walcount CPU %s; %d batches staged (the pace when staged, median / max: %s).\n\n",
		thousands(float64(x.backfillKeys)), thousands(float64(x.backfix)), dur(x.backfill), thousands(float64(x.lightTxns)), dur(x.backfillCPU), x.backfillLog.staged, x.backfillLog.pace())
	fmt.Fprintf(&b, "| round | txns/s | apply lag p50 | p99 | max (bucket) | probe p50 | probe p99 | catch-up | flushes | pieces | staged (keys) | pace when staged, median / max | slow flushes | walcount CPU |\n"+
		"|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for i, r := range x.rounds {
		fmt.Fprintf(&b, "| %d | %.0f | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %d (%s) | %s | %d | %s |\n", i+1, float64(r.txns)/r.window.Seconds(),
			seconds(r.lagP50), seconds(r.lagP99), boundSeconds(r.lagMax), dur(stats.Quantile(r.probes, 0.5)), dur(stats.Quantile(r.probes, 0.99)), dur(r.catchUp),
			r.flushes, r.pieces, r.log.staged, thousands(float64(r.log.keys)), r.log.pace(), r.log.slow, dur(r.cpu))
	}
	exact := "no"
	if x.exact {
		exact = "yes"
	}
	fmt.Fprintf(&b, "\nExact after the rounds: %s (every column against its source rows).", exact)
	if x.deadlocked > 0 {
		fmt.Fprintf(&b, " %d of the app's transactions deadlocked in its triggers before the drop and were lost, as an app's would be.", x.deadlocked)
	}
	b.WriteString("\n\n")
	return b.String()
}

// boundSeconds prints a histogram bucket's upper bound.
func boundSeconds(s float64) string {
	if math.IsInf(s, 1) {
		return "beyond the last bucket"
	}
	return "≤ " + seconds(s)
}
