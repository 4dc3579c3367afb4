package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/testkit/appschema"
)

// This file tests counters declared in a config file, end to end: several
// counters at once, every key type, unchanged TOASTed values and schema
// changes of a source table while walcount streams.

// assertNone fails the test with what query returns: it must select the
// rows whose counter differs from the truth, as (key, cached, truth).
func (e *env) assertNone(what, query string) {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), query)
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	defer rows.Close()
	var bad []string
	for rows.Next() {
		var key, cached, truth string
		if err := rows.Scan(&key, &cached, &truth); err != nil {
			e.t.Fatalf("%s: %v", what, err)
		}
		bad = append(bad, fmt.Sprintf("%s: cached %s, true %s", key, cached, truth))
	}
	if err := rows.Err(); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	if len(bad) > 0 {
		e.t.Fatalf("%s: %d keys are off:\n%s", what, len(bad), strings.Join(bad, "\n"))
	}
}

// assertHealthy fails the test when the daemon stopped or a session
// failed: a counter that is exact after a restart still means the stream
// broke.
func (e *env) assertHealthy(r *running) {
	e.t.Helper()
	select {
	case <-r.done:
		e.t.Fatalf("the daemon stopped: %v", r.err)
	default:
	}
	if st := r.d.Status(context.Background()); st.LastError != "" {
		e.t.Fatalf("a session failed: %s", st.LastError)
	}
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// loadConfig writes yaml to a file and loads it as walcount run would,
// with ${PG_URL} and ${REDIS_URL} expanded to e's servers.
func (e *env) loadConfig(yaml string) config.Config {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "walcount.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		e.t.Fatal(err)
	}
	vars := map[string]string{"PG_URL": e.pg.URL(), "REDIS_URL": e.redis.URL()}
	cfg, err := config.Load(path, func(k string) (string, bool) { v, ok := vars[k]; return v, ok }, config.Overrides{})
	if err != nil {
		e.t.Fatalf("load config: %v", err)
	}
	return cfg
}

// testSettings are the intervals every test config sets, as newEnv does.
const testSettings = `
database_url: ${PG_URL}
redis_url: "${REDIS_URL}"
flush_interval: 100ms
heartbeat_interval: 200ms
slot_monitor:
  poll_interval: 200ms
`

var severalSchema = appschema.SQL(appschema.Options{
	PostsColumns: "live_likes_count integer NOT NULL DEFAULT 0, likes_weight numeric(14,2) NOT NULL DEFAULT 0",
	LikesColumns: likedBy + ", deleted_at timestamptz, weight numeric(12,2)", Index: true, Posts: 30}) + `
ALTER TABLE likes ALTER COLUMN post_id DROP NOT NULL;
CREATE TABLE users (id bigint PRIMARY KEY, comments_count bigint NOT NULL DEFAULT 0);
CREATE TABLE comments (id bigserial PRIMARY KEY, user_id bigint NOT NULL, body text);
ALTER TABLE comments REPLICA IDENTITY FULL;
INSERT INTO users (id) SELECT g FROM generate_series(1, 20) g;
`

const severalConfig = testSettings + `
counters:
  - name: post_likes
    source: likes
    key: post_id
    target: posts
    target_key: id
    column: likes_count
  - name: post_live_likes          # soft-deleted likes do not count
    source: public.likes
    key: post_id
    target: public.posts
    target_key: id
    column: live_likes_count
    where: { deleted_at: null }
  - name: post_likes_weight        # numeric(12,2) sum
    source: likes
    key: post_id
    target: posts
    target_key: id
    column: likes_weight
    sum: weight
  - name: user_comments            # a second source into a second target
    source: comments
    key: user_id
    target: users
    target_key: id
    column: comments_count
`

// assertSeveralExact compares every counter of severalConfig with SQL.
func (e *env) assertSeveralExact() {
	e.t.Helper()
	e.assertNone("posts", `
SELECT p.id::text, format('%s/%s/%s', p.likes_count, p.live_likes_count, p.likes_weight),
       format('%s/%s/%s', count(l.id), count(l.id) FILTER (WHERE l.deleted_at IS NULL), coalesce(sum(l.weight), 0))
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id
HAVING p.likes_count <> count(l.id)
    OR p.live_likes_count <> count(l.id) FILTER (WHERE l.deleted_at IS NULL)
    OR p.likes_weight <> coalesce(sum(l.weight), 0)
ORDER BY p.id`)
	e.assertNone("users", `
SELECT u.id::text, u.comments_count::text, count(c.id)::text
FROM users u LEFT JOIN comments c ON c.user_id = u.id
GROUP BY u.id HAVING u.comments_count <> count(c.id) ORDER BY u.id`)
	var likes, live int64
	var weight string
	if err := e.db.QueryRow(context.Background(),
		"SELECT count(*), count(*) FILTER (WHERE deleted_at IS NULL), coalesce(sum(weight), 0)::text FROM likes").Scan(&likes, &live, &weight); err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("all counters exact: %d likes, %d live, weight %s", likes, live, weight)
}

// severalWorkload is the traffic of an app whose likes have a weight and
// can be soft-deleted and restored, and whose users write comments.
func severalWorkload(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	w := newWorkload(e.db)
	w.posts = 30
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c+1), uint64(ops)*7))
			for range ops {
				if err := severalOp(ctx, w, rng); err != nil {
					w.bad.Add(1)
				} else {
					w.ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	w.report(t)
	if w.bad.Load() > 0 {
		t.Fatalf("%d operations failed", w.bad.Load())
	}
}

// weight returns a random numeric(12,2) literal, sometimes negative or
// NULL.
func weight(rng *rand.Rand) any {
	switch rng.IntN(10) {
	case 0:
		return nil
	case 1:
		return fmt.Sprintf("-%d.%02d", rng.IntN(10), rng.IntN(100))
	}
	return fmt.Sprintf("%d.%02d", rng.IntN(1000), rng.IntN(100))
}

const pickLike = "(SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)"

func severalOp(ctx context.Context, w *workload, rng *rand.Rand) error {
	db := w.db
	user := func() int64 { return 1 + rng.Int64N(20) }
	var err error
	switch k := rng.IntN(100); {
	case k < 20:
		_, err = db.Exec(ctx, "INSERT INTO likes (post_id, weight) VALUES ($1, $2::text::numeric), ($3, $4::text::numeric)",
			w.post(rng), weight(rng), w.post(rng), weight(rng))
	case k < 28: // move
		_, err = db.Exec(ctx, "UPDATE likes SET post_id = $2 WHERE id = "+pickLike, w.post(rng), w.post(rng))
	case k < 38: // soft delete
		_, err = db.Exec(ctx, "UPDATE likes SET deleted_at = now() WHERE id = (SELECT id FROM likes WHERE post_id = $1 AND deleted_at IS NULL LIMIT 1)", w.post(rng))
	case k < 45: // restore
		_, err = db.Exec(ctx, "UPDATE likes SET deleted_at = NULL WHERE id = (SELECT id FROM likes WHERE post_id = $1 AND deleted_at IS NOT NULL LIMIT 1)", w.post(rng))
	case k < 53: // weight change
		_, err = db.Exec(ctx, "UPDATE likes SET weight = $2::text::numeric WHERE id = "+pickLike, w.post(rng), weight(rng))
	case k < 56: // move, soft delete and reweigh at once
		_, err = db.Exec(ctx, "UPDATE likes SET post_id = $2, deleted_at = CASE WHEN deleted_at IS NULL THEN now() END, weight = weight + 0.01 WHERE id = "+pickLike, w.post(rng), w.post(rng))
	case k < 59: // key to NULL and back
		_, err = db.Exec(ctx, "UPDATE likes SET post_id = NULL WHERE id = "+pickLike, w.post(rng))
	case k < 62:
		_, err = db.Exec(ctx, "UPDATE likes SET post_id = $1 WHERE id = (SELECT id FROM likes WHERE post_id IS NULL LIMIT 1)", w.post(rng))
	case k < 70: // hard delete
		_, err = db.Exec(ctx, "DELETE FROM likes WHERE id = "+pickLike, w.post(rng))
	case k < 73: // no-op for every counter
		_, err = db.Exec(ctx, "UPDATE likes SET user_id = user_id + 1 WHERE id = "+pickLike, w.post(rng))
	case k < 83:
		_, err = db.Exec(ctx, "INSERT INTO comments (user_id, body) VALUES ($1, 'hi')", user())
	case k < 87:
		_, err = db.Exec(ctx, "UPDATE comments SET user_id = $2 WHERE id = (SELECT id FROM comments WHERE user_id = $1 LIMIT 1)", user(), user())
	case k < 92:
		_, err = db.Exec(ctx, "DELETE FROM comments WHERE id = (SELECT id FROM comments WHERE user_id = $1 LIMIT 1)", user())
	default: // both tables in one transaction, sometimes rolled back
		err = w.tx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id, weight) VALUES ($1, $2::text::numeric)", w.post(rng), weight(rng)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO comments (user_id) VALUES ($1)", user()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE likes SET deleted_at = now() WHERE id = "+pickLike, w.post(rng)); err != nil {
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

// TestSeveralCounters runs a count, a filtered count and a numeric sum on
// one source and a count on a second source into a second target, from a
// YAML file, under moves, soft deletes and restores, weight changes,
// deletes, a TRUNCATE of one source and a TRUNCATE of both in one
// statement.
func TestSeveralCounters(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, severalSchema, func(e *env) { e.cfg = e.loadConfig(severalConfig) })
	if len(e.cfg.Counters) != 4 {
		t.Fatalf("loaded %d counters, want 4", len(e.cfg.Counters))
	}
	ctx := context.Background()
	d := e.start()
	severalWorkload(ctx, t, e, 4, 200)
	e.waitCaughtUp(catchUp)
	e.assertSeveralExact()

	// TRUNCATE of one source resets only the counters it feeds.
	e.exec("TRUNCATE comments")
	e.waitCaughtUp(catchUp)
	e.assertSeveralExact()
	var likesCount int64
	if err := e.db.QueryRow(ctx, "SELECT sum(likes_count) FROM posts").Scan(&likesCount); err != nil {
		t.Fatal(err)
	}
	if likesCount == 0 {
		t.Fatal("TRUNCATE comments reset posts.likes_count too")
	}
	severalWorkload(ctx, t, e, 4, 150)

	// Both sources in one statement, inside a transaction with changes
	// before and after it.
	e.inTransaction(
		"INSERT INTO likes (post_id, weight) VALUES (1, 1.50), (2, 2.25)",
		"INSERT INTO comments (user_id) VALUES (1), (2)",
		"TRUNCATE likes, comments",
		"INSERT INTO likes (post_id, weight, deleted_at) VALUES (1, 0.10, NULL), (3, 3.33, now()), (3, NULL, NULL)",
		"INSERT INTO comments (user_id) VALUES (5), (5)",
	)
	e.waitCaughtUp(catchUp)
	e.assertSeveralExact()

	severalWorkload(ctx, t, e, 4, 150)
	e.waitCaughtUp(catchUp)
	e.assertSeveralExact()
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestKeyTypes counts likes into posts keyed by each key type walcount
// supports (bigint is what the other tests use).
func TestKeyTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		keyType string
		keys    string // SQL that returns the posts' keys
	}{
		{"smallint", "SELECT g::smallint FROM generate_series(-3, 12) g"},
		{"integer", "SELECT (g * 100000)::integer FROM generate_series(1, 15) g"},
		{"uuid", "SELECT gen_random_uuid() FROM generate_series(1, 15)"},
		{"text", `SELECT unnest(ARRAY['a', 'B', 'with space', 'with:colon', 'ünïcödé', 'quote''s', '{"json":1}', 'a,b', '', 'tab	x',
		                             '10', '9', 'NULL', '\x00ff', repeat('long', 50)])`},
		{"character varying(300)", "SELECT 'slug-' || g FROM generate_series(1, 15) g"},
	}
	for _, tc := range tests {
		t.Run(tc.keyType, func(t *testing.T) {
			t.Parallel()
			ddl := appschema.SQL(appschema.Options{KeyType: tc.keyType}) + `
ALTER TABLE posts ALTER COLUMN likes_count TYPE integer;
ALTER TABLE likes ALTER COLUMN post_id DROP NOT NULL;
INSERT INTO posts (id) ` + tc.keys
			e := newEnvWith(t, ddl, nil)
			d := e.start()
			ctx := context.Background()
			var wg sync.WaitGroup
			for c := range 3 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(c+1), 99))
					for range 150 {
						var err error
						const post = "(SELECT id FROM posts ORDER BY random() LIMIT 1)"
						switch k := rng.IntN(10); {
						case k < 5:
							_, err = e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT id FROM posts ORDER BY random() LIMIT 2")
						case k < 7:
							_, err = e.db.Exec(ctx, "UPDATE likes SET post_id = "+post+" WHERE id = (SELECT id FROM likes ORDER BY random() LIMIT 1)")
						case k < 8:
							_, err = e.db.Exec(ctx, "UPDATE likes SET post_id = NULL WHERE id = (SELECT id FROM likes ORDER BY random() LIMIT 1)")
						default:
							_, err = e.db.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes ORDER BY random() LIMIT 1)")
						}
						if err != nil {
							t.Errorf("workload: %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			// A like of a post that does not exist is dropped, not an error.
			if tc.keyType != "uuid" {
				e.exec("INSERT INTO likes (post_id) VALUES ('77')")
			} else {
				e.exec("INSERT INTO likes (post_id) VALUES (gen_random_uuid())")
			}
			e.waitCaughtUp(catchUp)
			e.assertNone("posts", `
SELECT p.id::text, p.likes_count::text, count(l.id)::text
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id HAVING p.likes_count <> count(l.id)`)
			var total int64
			if err := e.db.QueryRow(ctx, "SELECT sum(likes_count) FROM posts").Scan(&total); err != nil || total == 0 {
				t.Fatalf("sum of likes_count = %d, %v: nothing was counted", total, err)
			}
			e.assertHealthy(d)
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// bigText makes random, incompressible text, so that a row holding it is
// TOASTed out of line.
const bigText = `CREATE FUNCTION big(n int) RETURNS text LANGUAGE sql AS
$$ SELECT string_agg(md5(random()::text), '') FROM generate_series(1, n / 32) $$;`

// peekDecoded returns what a test_decoding slot shows of the changes since
// it was created.
func (e *env) peekDecoded(slot string) []string {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), "SELECT data FROM pg_logical_slot_peek_changes($1, NULL, NULL)", slot)
	if err != nil {
		e.t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return lines
}

// toastOps is traffic that leaves TOASTed status and note values
// unchanged in most UPDATEs.
func toastOps(t *testing.T, e *env, ops int, insert string) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, uint64(ops)))
	const pick = "(SELECT id FROM likes ORDER BY random() LIMIT 1)"
	for i := range ops {
		var err error
		switch k := rng.IntN(12); {
		case k < 3:
			_, err = e.db.Exec(ctx, insert, int64(i+1000), 1+rng.IntN(10))
		case k < 5: // moves: status and note arrive as 'u'
			_, err = e.db.Exec(ctx, "UPDATE likes SET post_id = $1 WHERE id = "+pick, 1+rng.IntN(10))
		case k < 7: // touches neither
			_, err = e.db.Exec(ctx, "UPDATE likes SET user_id = user_id + 1 WHERE id = "+pick)
		case k < 8:
			_, err = e.db.Exec(ctx, "UPDATE likes SET note = CASE WHEN note IS NULL THEN big(4000) END WHERE id = "+pick)
		case k < 9:
			_, err = e.db.Exec(ctx, "UPDATE likes SET status = CASE status WHEN 'live' THEN big(2000) ELSE 'live' END WHERE id = "+pick)
		case k < 10:
			_, err = e.db.Exec(ctx, "UPDATE likes SET note = big(4000), post_id = $1 WHERE id = "+pick, 1+rng.IntN(10))
		default:
			_, err = e.db.Exec(ctx, "DELETE FROM likes WHERE id = "+pick)
		}
		if err != nil {
			t.Fatalf("workload: %v", err)
		}
	}
}

const toastConfig = testSettings + `
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_live_likes, source: likes, key: post_id, target: posts, target_key: id, column: live_count, where: {status: live}}
  - {name: post_plain_likes, source: likes, key: post_id, target: posts, target_key: id, column: plain_count, where: {note: null}}
`

const toastTruth = `
SELECT p.id::text, format('%s/%s/%s', p.likes_count, p.live_count, p.plain_count),
       format('%s/%s/%s', count(l.id), count(l.id) FILTER (WHERE l.status = 'live'), count(l.id) FILTER (WHERE l.note IS NULL))
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id
HAVING p.likes_count <> count(l.id) OR p.live_count <> count(l.id) FILTER (WHERE l.status = 'live')
    OR p.plain_count <> count(l.id) FILTER (WHERE l.note IS NULL)`

// toastOptions are the tables of the TOAST tests: likes have a status and a
// note, and posts count them by each.
var toastOptions = appschema.Options{
	PostsColumns: "live_count bigint NOT NULL DEFAULT 0, plain_count bigint NOT NULL DEFAULT 0",
	LikesColumns: likedBy + ", status text NOT NULL, note text", Posts: 10}

// TestUnchangedToastFull: under REPLICA IDENTITY FULL, PostgreSQL 15 logs
// the old row with its TOASTed values detoasted, while pgoutput sends an
// unchanged TOASTed value of the new row as 'u'. The filters on the
// TOASTed columns (status = 'live', note IS NULL) must take the old value
// and never read 'u' as NULL.
func TestUnchangedToastFull(t *testing.T) {
	t.Parallel()
	ddl := appschema.SQL(toastOptions) + bigText
	e := newEnvWith(t, ddl, func(e *env) {
		e.cfg = e.loadConfig(toastConfig)
		e.exec("SELECT pg_create_logical_replication_slot('peek', 'test_decoding')")
	})
	d := e.start()
	toastOps(t, e, 300, `INSERT INTO likes (id, post_id, status, note)
VALUES ($1::bigint, $2, CASE WHEN $1::bigint % 3 = 0 THEN big(2000) ELSE 'live' END, CASE WHEN $1::bigint % 2 = 0 THEN big(4000) END)`)
	e.waitCaughtUp(catchUp)
	e.assertNone("posts", toastTruth)
	e.assertHealthy(d)

	// What really arrived: the new row's unchanged TOASTed columns were
	// left out, the old row carried them in full.
	var unchanged, oldToasted int
	for _, l := range e.peekDecoded("peek") {
		if !strings.Contains(l, ": UPDATE:") {
			continue
		}
		old, new, _ := strings.Cut(l, "new-tuple:")
		if strings.Contains(new, "note[text]:unchanged-toast-datum") && !strings.Contains(old, "note[text]:unchanged-toast-datum") {
			unchanged++
		}
		if strings.Contains(old, "unchanged-toast-datum") {
			oldToasted++
		}
	}
	t.Logf("%d UPDATEs sent note as unchanged TOAST with its old value in the old row", unchanged)
	if unchanged == 0 {
		t.Fatal("no UPDATE left a TOASTed note out of the new row: the test does not test TOAST")
	}
	if oldToasted > 0 {
		t.Fatalf("%d old rows had unchanged TOASTed values under REPLICA IDENTITY FULL", oldToasted)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestUnchangedToastIdentityIndex: under REPLICA IDENTITY USING INDEX whose
// columns include a TOASTed status, PostgreSQL logs the old key even for
// UPDATEs that leave the key alone (it must, since the new row's copy is
// left out as 'u'), so the filter on status always has a value.
func TestUnchangedToastIdentityIndex(t *testing.T) {
	t.Parallel()
	ddl := appschema.SQL(toastOptions) + bigText + `
CREATE UNIQUE INDEX likes_ident ON likes (id, post_id, status);
ALTER TABLE likes REPLICA IDENTITY USING INDEX likes_ident;`
	// A note filter would need note in the identity. status is NOT NULL,
	// so the IS NULL filter must count nothing: a 'u' taken for NULL
	// would count the likes whose status is TOASTed.
	cfg := strings.Replace(toastConfig, "column: plain_count, where: {note: null}", "column: plain_count, where: {status: null}", 1)
	e := newEnvWith(t, ddl, func(e *env) {
		e.cfg = e.loadConfig(cfg)
		e.exec("SELECT pg_create_logical_replication_slot('peek', 'test_decoding')")
	})
	d := e.start()
	toastOps(t, e, 300, `INSERT INTO likes (id, post_id, status, note)
VALUES ($1::bigint, $2, CASE WHEN $1::bigint % 3 = 0 THEN big(2000) ELSE 'live' END, big(8000))`)
	e.waitCaughtUp(catchUp)
	e.assertNone("posts", `
SELECT p.id::text, format('%s/%s/%s', p.likes_count, p.live_count, p.plain_count),
       format('%s/%s/0', count(l.id), count(l.id) FILTER (WHERE l.status = 'live'))
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id
HAVING p.likes_count <> count(l.id) OR p.live_count <> count(l.id) FILTER (WHERE l.status = 'live') OR p.plain_count <> 0`)
	e.assertHealthy(d)

	var unchanged int
	for _, l := range e.peekDecoded("peek") {
		old, new, found := strings.Cut(l, "new-tuple:")
		if found && strings.Contains(new, "status[text]:unchanged-toast-datum") {
			if !strings.Contains(old, "old-key:") || strings.Contains(old, "unchanged-toast-datum") {
				t.Fatalf("an UPDATE sent a TOASTed key column as unchanged without its old value: %.300s", l)
			}
			unchanged++
		}
	}
	t.Logf("%d UPDATEs sent status as unchanged TOAST, each with the old key", unchanged)
	if unchanged == 0 {
		t.Fatal("no UPDATE left a TOASTed status out of the new row: the test does not test TOAST")
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestAlterTableMidStream changes the source table while walcount
// streams: a new column, a dropped unrelated column that shifts the
// positions of the counted ones, a column added inside a transaction that
// also changes rows, and a table rewrite.
func TestAlterTableMidStream(t *testing.T) {
	t.Parallel()
	// Its own likes: junk must come before the counted columns, so that
	// dropping it moves them.
	ddl := appschema.SQL(appschema.Options{PostsColumns: "likes_weight numeric(14,2) NOT NULL DEFAULT 0",
		LikesLeadingColumns: "junk text DEFAULT 'junk'", LikesColumns: "weight numeric(12,2)", Posts: 20})
	e := newEnvWith(t, ddl, func(e *env) {
		e.cfg = e.loadConfig(testSettings + `
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_weight, source: likes, key: post_id, target: posts, target_key: id, column: likes_weight, sum: weight}
`)
	})
	d := e.start()
	ctx := context.Background()
	traffic := func(seed uint64) {
		t.Helper()
		rng := rand.New(rand.NewPCG(seed, 3))
		post := func() int { return 1 + rng.IntN(20) }
		for range 120 {
			var err error
			switch k := rng.IntN(10); {
			case k < 4:
				_, err = e.db.Exec(ctx, "INSERT INTO likes (post_id, weight) VALUES ($1, $2::text::numeric)", post(), weight(rng))
			case k < 6:
				_, err = e.db.Exec(ctx, "UPDATE likes SET post_id = $2, weight = weight + 1.01 WHERE id = "+pickLike, post(), post())
			case k < 8:
				_, err = e.db.Exec(ctx, "UPDATE likes SET weight = $2::text::numeric WHERE id = "+pickLike, post(), weight(rng))
			default:
				_, err = e.db.Exec(ctx, "DELETE FROM likes WHERE id = "+pickLike, post())
			}
			if err != nil {
				t.Fatalf("workload: %v", err)
			}
		}
	}
	truth := `
SELECT p.id::text, format('%s/%s', p.likes_count, p.likes_weight), format('%s/%s', count(l.id), coalesce(sum(l.weight), 0))
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id HAVING p.likes_count <> count(l.id) OR p.likes_weight <> coalesce(sum(l.weight), 0)`

	traffic(1)
	e.exec("ALTER TABLE likes ADD COLUMN extra integer DEFAULT 7")
	traffic(2)
	e.exec("ALTER TABLE likes DROP COLUMN junk") // post_id and weight move up one place
	traffic(3)
	e.inTransaction(
		"INSERT INTO likes (post_id, weight) VALUES (1, 1.00)",
		"ALTER TABLE likes ADD COLUMN source text",
		"INSERT INTO likes (post_id, weight, source) VALUES (2, 2.00, 'web'), (2, 0.50, 'app')",
		"UPDATE likes SET post_id = 3, source = 'moved' WHERE post_id = 1",
		"ALTER TABLE likes DROP COLUMN extra",
		"DELETE FROM likes WHERE id = (SELECT min(id) FROM likes WHERE post_id = 2)",
	)
	traffic(4)
	e.exec("ALTER TABLE likes ALTER COLUMN source TYPE varchar(20)") // rewrites the table
	traffic(5)
	e.waitCaughtUp(catchUp)
	e.assertNone("posts", truth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestDroppedCountedColumnStops drops the summed column while walcount
// streams: the next change of the table cannot be attributed, and the
// daemon stops with an error naming the counter rather than count it
// wrongly; nothing of that transaction reaches the counters.
func TestDroppedCountedColumnStops(t *testing.T) {
	t.Parallel()
	ddl := appschema.SQL(appschema.Options{PostsColumns: "likes_weight numeric(14,2) NOT NULL DEFAULT 0",
		LikesColumns: "weight numeric(12,2)", Posts: 3})
	e := newEnvWith(t, ddl, func(e *env) {
		e.cfg = e.loadConfig(testSettings + `
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_weight, source: likes, key: post_id, target: posts, target_key: id, column: likes_weight, sum: weight}
`)
	})
	d := e.start()
	e.exec("INSERT INTO likes (post_id, weight) VALUES (1, 1.25), (2, 2.50)")
	e.waitCaughtUp(catchUp)
	e.exec("ALTER TABLE likes DROP COLUMN weight")
	e.exec("INSERT INTO likes (post_id) VALUES (1)")
	err := d.wait(t, catchUp)
	if !errors.Is(err, aggregator.ErrNotAttributable) || !strings.Contains(err.Error(), "counter post_weight") ||
		!strings.Contains(err.Error(), `sum column "weight"`) {
		t.Fatalf("daemon returned %v; want ErrNotAttributable naming counter post_weight and column weight", err)
	}
	var count int64
	var weight string
	if err := e.db.QueryRow(context.Background(), "SELECT likes_count, likes_weight::text FROM posts WHERE id = 1").Scan(&count, &weight); err != nil {
		t.Fatal(err)
	}
	if count != 1 || weight != "1.25" {
		t.Fatalf("post 1 = %d likes, weight %s; want 1 and 1.25, from before the column was dropped", count, weight)
	}
}
