package main

// The soak (`make soak`, `go run ./bench -soak 1h`): a long run of mixed
// churn over every kind of counter, with a fault every few minutes in
// rotation, that samples the resources of walcount and its servers into a
// CSV and checks every counter exact at each quiet point. It is about
// correctness and leaks, not speed: docs/benchmarks.md (The soak) says how
// to read it.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// soakSettings are the soak's settings (flags -soak*).
type soakSettings struct {
	duration    time.Duration // 0: no soak
	faultEvery  time.Duration
	sampleEvery time.Duration
	settleLimit time.Duration
	lockHold    time.Duration
	bulk        int64
	clients     int
	faults      []string // the rotation; empty: soakFaults
	out         string   // directory of the CSV and the summary
}

// The soak's app: posts of users, likes of posts, a site-wide row and a
// row per liker created on demand. Posts [0, soakPosts) take likes from
// every client; posts [soakPosts, soakPosts+soakEphemeral) belong to one
// client, which deletes and re-creates them with their likes (a target
// row deleted and re-inserted with the same key, a parent of the via
// counter gone and back).
const (
	soakUsers     = 500
	soakPosts     = 5000
	soakEphemeral = 50
)

const soakSchemaSQL = `
CREATE TABLE users (id bigint PRIMARY KEY, total_likes bigint NOT NULL DEFAULT 0, karma bigint NOT NULL DEFAULT 0);
INSERT INTO users (id) SELECT g FROM generate_series(0, 499) g;
CREATE TABLE posts (id bigint PRIMARY KEY, user_id bigint, likes_count bigint NOT NULL DEFAULT 0,
  visible_likes bigint NOT NULL DEFAULT 0, weight_sum bigint NOT NULL DEFAULT 0, last_liked_at timestamptz);
INSERT INTO posts (id, user_id) SELECT g, g % 500 FROM generate_series(0, 5049) g;
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL,
  hidden boolean NOT NULL DEFAULT false, weight integer NOT NULL DEFAULT 1,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp());
ALTER TABLE likes REPLICA IDENTITY FULL;
CREATE INDEX likes_post_created_idx ON likes (post_id, created_at);
CREATE INDEX likes_user_idx ON likes (user_id);
CREATE TABLE site (id integer PRIMARY KEY, likes_total bigint NOT NULL DEFAULT 0);
INSERT INTO site VALUES (1, 0);
CREATE TABLE likers (user_id bigint PRIMARY KEY, likes_given bigint NOT NULL DEFAULT 0);
`

// soakYAML has a counter of every kind: a count, a filtered count, a sum,
// a maximum, a multi-level sum of the count, a count through a parent, a
// total with no key and a count that creates its target rows.
const soakYAML = `counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_visible, source: likes, key: post_id, target: posts, target_key: id, column: visible_likes, where: {hidden: false}}
  - {name: post_weight, source: likes, key: post_id, target: posts, target_key: id, column: weight_sum, sum: weight}
  - {name: post_last_liked, source: likes, key: post_id, target: posts, target_key: id, column: last_liked_at, max: created_at}
  - {name: user_likes, source: posts, key: user_id, target: users, target_key: id, column: total_likes, sum: likes_count}
  - {name: user_karma, source: likes, key: post_id, via: {table: posts, key: id, column: user_id}, target: users, target_key: id, column: karma}
  - {name: site_likes, source: likes, target_row: 1, target: site, target_key: id, column: likes_total}
  - {name: liker_likes, source: likes, key: user_id, target: likers, target_key: user_id, column: likes_given, create_missing: true}
`

// soakChecks are the truth queries: each returns the rows whose counter
// differs from what the source holds now, and how many rows it compared.
var soakChecks = []struct{ counter, sql string }{
	{"post_likes", `SELECT count(*) FILTER (WHERE p.likes_count <> coalesce(l.n, 0)), count(*)
FROM posts p LEFT JOIN (SELECT post_id, count(*) AS n FROM likes GROUP BY post_id) l ON l.post_id = p.id`},
	{"post_visible", `SELECT count(*) FILTER (WHERE p.visible_likes <> coalesce(l.n, 0)), count(*)
FROM posts p LEFT JOIN (SELECT post_id, count(*) AS n FROM likes WHERE NOT hidden GROUP BY post_id) l ON l.post_id = p.id`},
	{"post_weight", `SELECT count(*) FILTER (WHERE p.weight_sum <> coalesce(l.n, 0)), count(*)
FROM posts p LEFT JOIN (SELECT post_id, sum(weight) AS n FROM likes GROUP BY post_id) l ON l.post_id = p.id`},
	{"post_last_liked", `SELECT count(*) FILTER (WHERE p.last_liked_at IS DISTINCT FROM l.m), count(*)
FROM posts p LEFT JOIN (SELECT post_id, max(created_at) AS m FROM likes GROUP BY post_id) l ON l.post_id = p.id`},
	{"user_likes", `SELECT count(*) FILTER (WHERE u.total_likes <> coalesce(p.n, 0)), count(*)
FROM users u LEFT JOIN (SELECT user_id, sum(likes_count) AS n FROM posts GROUP BY user_id) p ON p.user_id = u.id`},
	{"user_karma", `SELECT count(*) FILTER (WHERE u.karma <> coalesce(k.n, 0)), count(*)
FROM users u LEFT JOIN (SELECT p.user_id, count(*) AS n FROM likes l JOIN posts p ON p.id = l.post_id GROUP BY p.user_id) k ON k.user_id = u.id`},
	{"site_likes", `SELECT count(*) FILTER (WHERE s.likes_total <> (SELECT count(*) FROM likes)), count(*) FROM site s`},
	{"liker_likes", `SELECT count(*) FILTER (WHERE coalesce(r.likes_given, 0) <> coalesce(l.n, 0)), count(*)
FROM likers r FULL JOIN (SELECT user_id, count(*) AS n FROM likes GROUP BY user_id) l ON l.user_id = r.user_id`},
}

// soakFaults are the faults, in rotation; failover only on PostgreSQL 17
// and later (soakFaultsFor).
var soakFaults = []string{"kill -9", "postgres restart", "redis restart", "row lock", "bulk insert", "reconcile", "slot recreate", "failover"}

// soak is one soak run.
type soak struct {
	b       *bench
	s       soakSettings
	c       *cluster
	cfgPath string
	started time.Time
	standby *servers.Postgres // the primary's standby, when failover is in the rotation
	// failoverRun is the newest reconciliation run before the last
	// failover: the quiet point after it reports the runs since.
	failoverRun int64

	mu sync.Mutex
	wc *walcountProc // the running walcount; replaced after a kill

	csv     *os.File
	csvMu   sync.Mutex
	fault   atomic.Value // string: the fault in progress, for the CSV
	ops     atomic.Int64
	opErrs  atomic.Int64
	quiet   []quietPoint
	summary []string // log lines of the faults, for the report
}

// quietPoint is one check of every counter with the load stopped.
type quietPoint struct {
	at      time.Duration
	after   string
	settled time.Duration
	note    string // why it did not settle, or ""
	off     map[string]int64
	rows    map[string]int64
}

func (q quietPoint) exact() bool {
	for _, n := range q.off {
		if n != 0 {
			return false
		}
	}
	return len(q.off) == len(soakChecks)
}

// runSoak runs the soak and writes its CSV and summary; it returns an
// error when a quiet point found a counter off or the run could not go on.
func runSoak(ctx context.Context, b *bench, s soakSettings) error {
	if err := os.MkdirAll(s.out, 0o755); err != nil {
		return err
	}
	stamp := time.Now().UTC().Format("2006-01-02T150405")
	major, err := servers.PostgresMajor()
	if err != nil {
		return err
	}
	faults, note, err := soakFaultsFor(major, s.faults)
	if err != nil {
		return err
	}
	s.faults = faults
	k := &soak{b: b, s: s, started: time.Now()}
	if note != "" {
		k.summary = append(k.summary, note)
		b.logf("soak: %s", note)
	}
	k.fault.Store("")
	csvPath := filepath.Join(s.out, "soak-"+stamp+".csv")
	f, err := os.Create(csvPath)
	if err != nil {
		return err
	}
	defer f.Close()
	k.csv = f
	fmt.Fprintln(f, strings.Join(soakColumns, ","))
	b.logf("soak: %s, a fault every %s, samples every %s into %s", s.duration, s.faultEvery, s.sampleEvery, csvPath)

	if err := k.build(ctx); err != nil {
		return err
	}
	defer k.c.close()
	defer k.closeStandby()
	defer k.stopWalcount()

	runErr := k.loop(ctx)
	mdPath := filepath.Join(s.out, "soak-"+stamp+".md")
	md, err := soakSummary(csvPath, k.quiet, k.summary, k.s, time.Since(k.started), k.ops.Load(), k.opErrs.Load())
	if err == nil {
		err = os.WriteFile(mdPath, []byte(md), 0o644)
	}
	if err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Print(md)
	b.logf("soak: wrote %s and %s", csvPath, mdPath)
	if runErr != nil {
		return runErr
	}
	for _, q := range k.quiet {
		if !q.exact() {
			return fmt.Errorf("soak: a counter was off at the quiet point at %s (after %s): %v", q.at.Round(time.Second), q.after, q.off)
		}
	}
	return nil
}

// build starts the cluster, the app's schema and walcount.
func (k *soak) build(ctx context.Context) error {
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: benchSettings})
	if err != nil {
		return err
	}
	c := &cluster{pg: pg, url: pg.URL()}
	k.c = c
	if c.redis, err = servers.StartRedis(ctx, servers.RedisOptions{}); err != nil {
		return err
	}
	if c.db, err = openPool(ctx, c.url, 8); err != nil {
		return err
	}
	if _, err := c.db.Exec(ctx, soakSchemaSQL); err != nil {
		return fmt.Errorf("soak schema: %w", err)
	}
	k.cfgPath = filepath.Join(k.b.tmp, "soak.yaml")
	if err := c.setupYAML(ctx, k.cfgPath, soakYAML); err != nil {
		return err
	}
	if slices.Contains(k.s.faults, "failover") {
		if err := k.startFailoverPair(ctx); err != nil {
			return fmt.Errorf("standby: %w", err)
		}
	}
	if err := k.startWalcount(ctx); err != nil {
		return err
	}
	return c.backfilled(ctx, 5*time.Minute)
}

func (k *soak) startWalcount(ctx context.Context) error {
	wc, err := startReady(ctx, k.b, k.c, "--config", k.cfgPath)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.wc = wc
	k.mu.Unlock()
	return nil
}

func (k *soak) walcount() *walcountProc {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.wc
}

func (k *soak) stopWalcount() {
	if wc := k.walcount(); wc != nil {
		_ = wc.stop()
	}
}

// loop runs the load, the sampler and the faults until the duration is
// over: each period of faultEvery is load, a fault, load, a quiet point.
func (k *soak) loop(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); k.sampler(ctx) }()
	defer wg.Wait()
	defer cancel()

	end := k.started.Add(k.s.duration)
	// A quiet point before any fault: the backfill and the setup.
	if err := k.quietPoint(ctx, "start"); err != nil {
		return err
	}
	for i := 0; time.Now().Before(end); i++ {
		name := k.s.faults[i%len(k.s.faults)]
		load := k.startLoad(ctx)
		if err := pause(ctx, k.s.faultEvery/3); err != nil {
			load.stop()
			return err
		}
		k.fault.Store(name)
		k.b.logf("soak %s: %s", time.Since(k.started).Round(time.Second), name)
		began := time.Now()
		ferr := k.inject(ctx, name)
		k.fault.Store("")
		if ferr != nil {
			load.stop()
			return fmt.Errorf("fault %s: %w", name, ferr)
		}
		k.summary = append(k.summary, fmt.Sprintf("%s at %s took %s", name, began.Sub(k.started).Round(time.Second), time.Since(began).Round(time.Second)))
		rest := k.s.faultEvery - time.Since(began) - k.s.faultEvery/3
		if rest < k.s.faultEvery/6 {
			rest = k.s.faultEvery / 6
		}
		if err := pause(ctx, rest); err != nil {
			load.stop()
			return err
		}
		load.stop()
		if err := k.quietPoint(ctx, name); err != nil {
			return err
		}
		if name == "failover" {
			k.failoverRepairs(ctx)
		}
	}
	return nil
}

// pause waits d, or returns ctx's error when ctx ends first.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// soakLoad is the churn of k.s.clients connections and the ephemeral
// posts' client.
type soakLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (l *soakLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func (k *soak) startLoad(ctx context.Context) *soakLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &soakLoad{cancel: cancel}
	for i := range k.s.clients {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); k.client(ctx, uint64(i), false) }()
	}
	l.wg.Add(1)
	go func() { defer l.wg.Done(); k.client(ctx, 1000, true) }()
	return l
}

// client runs random statements until ctx ends, reconnecting after an
// error (a restarted server, a terminated backend).
func (k *soak) client(ctx context.Context, seed uint64, ephemeral bool) {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.Connect(ctx, k.c.url)
			if err != nil {
				_ = pause(ctx, 200*time.Millisecond)
				continue
			}
			conn = c
		}
		var err error
		if ephemeral {
			err = k.ephemeralOp(ctx, conn, rng)
		} else {
			err = k.churnOp(ctx, conn, rng)
		}
		k.ops.Add(1)
		if err != nil && ctx.Err() == nil {
			k.opErrs.Add(1)
			conn.Close(context.Background())
			conn = nil
			_ = pause(ctx, 100*time.Millisecond)
		}
		// A paced load: the soak is about time, not throughput.
		_ = pause(ctx, 5*time.Millisecond)
	}
}

// churnOp is one change of the shared posts: mostly likes, some deleted,
// changed and moved, some posts moved to another user.
func (k *soak) churnOp(ctx context.Context, conn *pgx.Conn, rng *rand.Rand) error {
	post := rng.Int64N(soakPosts)
	if rng.IntN(4) == 0 {
		post = rng.Int64N(20) // a few hot posts
	}
	user := rng.Int64N(soakUsers)
	var err error
	switch n := rng.IntN(100); {
	case n < 50:
		_, err = conn.Exec(ctx, `INSERT INTO likes (post_id, user_id, hidden, weight) VALUES ($1, $2, $3, $4)`,
			post, user, rng.IntN(5) == 0, 1+rng.IntN(5))
	case n < 62: // the oldest like: the maximum stays
		_, err = conn.Exec(ctx, `DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY created_at LIMIT 1)`, post)
	case n < 70: // the newest: the maximum is computed again
		_, err = conn.Exec(ctx, `DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY created_at DESC LIMIT 1)`, post)
	case n < 82:
		_, err = conn.Exec(ctx, `UPDATE likes SET hidden = NOT hidden, weight = $2 WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY created_at LIMIT 1)`,
			post, 1+rng.IntN(5))
	case n < 90:
		_, err = conn.Exec(ctx, `UPDATE likes SET post_id = $2 WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY created_at LIMIT 1)`,
			post, rng.Int64N(soakPosts))
	case n < 96:
		_, err = conn.Exec(ctx, `UPDATE posts SET user_id = $2 WHERE id = $1`, post, user)
	default: // several likes in one transaction
		_, err = conn.Exec(ctx, `INSERT INTO likes (post_id, user_id, weight) SELECT $1 + g % 7, ($2 + g) % 500, 1 + g % 3 FROM generate_series(1, 20) g`,
			post%(soakPosts-7), user)
	}
	return err
}

// ephemeralOp likes an ephemeral post, or deletes one with its likes and
// inserts it again (under another user), in one transaction.
func (k *soak) ephemeralOp(ctx context.Context, conn *pgx.Conn, rng *rand.Rand) error {
	post := soakPosts + rng.Int64N(soakEphemeral)
	if rng.IntN(10) != 0 {
		_, err := conn.Exec(ctx, `INSERT INTO likes (post_id, user_id, hidden, weight) VALUES ($1, $2, $3, $4)`,
			post, rng.Int64N(soakUsers), rng.IntN(5) == 0, 1+rng.IntN(5))
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM likes WHERE post_id = $1`, post); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM posts WHERE id = $1`, post); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO posts (id, user_id) VALUES ($1, $2)`, post, rng.Int64N(soakUsers))
		return err
	})
}
