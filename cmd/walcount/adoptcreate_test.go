package main

import (
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// createSchema has likers rows that no app keeps: every counter of likers
// starts on likes that are already there, and liker_likes creates the
// rows (create_missing). Each other kind shares the target: a sum, a
// filtered count, a max, and a count and a max through the liked post's
// author (via).
const createSchema = `
CREATE TABLE posts (id bigint PRIMARY KEY, user_id bigint);
ALTER TABLE posts REPLICA IDENTITY FULL;
CREATE INDEX ON posts (user_id);
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, liker_id bigint NOT NULL, weight integer NOT NULL, at bigint NOT NULL);
ALTER TABLE likes REPLICA IDENTITY FULL;
CREATE INDEX ON likes (liker_id, at);
CREATE INDEX ON likes (post_id);
CREATE TABLE likers (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0, w bigint NOT NULL DEFAULT 0, heavy bigint NOT NULL DEFAULT 0,
  last bigint, got bigint NOT NULL DEFAULT 0, got_last bigint, label text NOT NULL);
INSERT INTO posts SELECT g, 1 + g % 150 FROM generate_series(1, 200) g;
INSERT INTO likes (post_id, liker_id, weight, at) SELECT 1 + (g * 7) % 200, 1 + (g * 13) % 300, g % 4, g FROM generate_series(1, 4000) g;`

const createConfig = `
reconcile: {batch_size: 10}
counters:
  - {name: liker_weight, source: likes, key: liker_id, target: likers, target_key: id, column: w, sum: weight}
  - {name: liker_heavy, source: likes, key: liker_id, target: likers, target_key: id, column: heavy, where: {weight: 3}}
  - {name: liker_last, source: likes, key: liker_id, target: likers, target_key: id, column: last, max: at}
  - {name: liker_got, source: likes, key: post_id, target: likers, target_key: id, column: got,
     via: {table: posts, key: id, column: user_id}}
  - {name: liker_got_last, source: likes, key: post_id, target: likers, target_key: id, column: got_last, max: at,
     via: {table: posts, key: id, column: user_id}}
  - {name: liker_likes, source: likes, key: liker_id, target: likers, target_key: id, column: n,
     create_missing: {defaults: {label: walcount}}}
`

// createOff lists every likers row with a column its likes do not give.
const createOff = `
SELECT format('liker %s: %s want %s', l.id, row(l.n, l.w, l.heavy, l.got, l.last, l.got_last), row(a.n, a.w, a.h, b.g, a.mx, b.mx))
FROM likers l
CROSS JOIN LATERAL (SELECT count(*) AS n, coalesce(sum(weight), 0) AS w, count(*) FILTER (WHERE weight = 3) AS h, max(at) AS mx
                    FROM likes WHERE liker_id = l.id) a
CROSS JOIN LATERAL (SELECT count(*) AS g, max(k.at) AS mx FROM likes k JOIN posts p ON p.id = k.post_id WHERE p.user_id = l.id) b
WHERE row(l.n, l.w, l.heavy, l.got) <> row(a.n, a.w, a.h, b.g) OR l.last IS DISTINCT FROM a.mx OR l.got_last IS DISTINCT FROM b.mx`

// TestBackfillCreatesRowsNeverWrong: the backfill of a create_missing
// counter creates the target rows of the keys with source rows; the
// target's other counters (sum, filtered, max, via count and max) share
// the rows. With
// no write, every created row must hold its true values from the moment
// it is seen: a row created with 0 and the defaults was off until the
// measurement of each counter reached it (issue 35 §1).
func TestBackfillCreatesRowsNeverWrong(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), createSchema)
	path := c.writeConfig(createConfig)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + unusedAddr(t), "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	w := startAdoptPoller(t, c.db, createOff)
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	p := startWalcount(t, env, "run")
	wait.For(t, 2*time.Minute, "the backfill done", func() bool {
		return c.count(`SELECT count(*) FROM walcount.reconcile_runs WHERE slot_name = $1 AND kind = 'backfill' AND status = 'done'`, c.slot) == 1
	})
	c.waitCheckpointPastNow()
	c.waitCheckpointPastNow()
	polls, wrong, err := w.stop()
	if err != nil {
		t.Fatal(err)
	}
	if polls < 10 {
		t.Fatalf("only %d polls: the test saw nothing", polls)
	}
	if len(wrong) > 0 {
		t.Fatalf("%d of %d polls saw wrong values; the first ones:\n%s\nwalcount's log:\n%s", len(wrong), polls,
			strings.Join(wrong[:min(len(wrong), 5)], "\n"), p.stderr.String())
	}
	if n := c.count(`SELECT count(*) FROM (SELECT DISTINCT liker_id FROM likes) k WHERE NOT EXISTS (SELECT 1 FROM likers WHERE id = k.liker_id)`); n != 0 {
		t.Fatalf("%d likers have no row after the backfill", n)
	}
	t.Logf("%d polls, %d likers rows, every one right", polls, c.count("SELECT count(*) FROM likers"))
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
