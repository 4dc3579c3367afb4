package daemon

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/reconcile"
)

// This file tests the counter kinds beyond counts, equality filters and
// numeric sums (issue 27): filters with IS NOT NULL, IN, <> and NOT IN, a
// boolean summed as +1/-1, and a sum over a generated column derived from
// the columns the WAL carries.

const kindsSchema = `
CREATE TABLE posts (id bigint PRIMARY KEY,
  reactions bigint NOT NULL DEFAULT 0, clean bigint NOT NULL DEFAULT 0,
  votes bigint NOT NULL DEFAULT 0, points bigint NOT NULL DEFAULT 0);
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint, user_id bigint,
  kind text, status smallint, up boolean, base integer, bonus integer,
  total integer GENERATED ALWAYS AS (base * 2 - bonus + (up)::integer) STORED);
ALTER TABLE votes REPLICA IDENTITY FULL;
CREATE INDEX ON votes (post_id);
INSERT INTO posts (id) SELECT g FROM generate_series(1, 30) g;
INSERT INTO votes (post_id, user_id, kind, status, up, base, bonus)
SELECT 1 + g % 30, CASE WHEN g % 7 <> 0 THEN g END, (ARRAY['like', 'love', 'spam', NULL])[1 + g % 4],
       CASE WHEN g % 5 <> 0 THEN g % 4 END, CASE WHEN g % 6 <> 0 THEN g % 3 = 0 END, g % 9 - 4, g % 5
FROM generate_series(1, 600) g;
`

const kindsConfig = testSettings + `
counters:
  - name: post_reactions           # IS NOT NULL, IN and <>
    source: votes
    key: post_id
    target: posts
    target_key: id
    column: reactions
    where: { user_id: { not: null }, kind: [like, love], status: { not: 3 } }
  - name: post_clean               # NOT IN and equality
    source: votes
    key: post_id
    target: posts
    target_key: id
    column: clean
    where: { kind: { not: [spam] }, up: true }
  - name: post_votes               # a boolean summed as +1/-1
    source: votes
    key: post_id
    target: posts
    target_key: id
    column: votes
    sum: up
  - name: post_points              # a generated column, derived
    source: votes
    key: post_id
    target: posts
    target_key: id
    column: points
    sum: total
`

// kindsTruth selects the posts whose counters differ from SQL's own
// evaluation of the same filters and sums.
const kindsTruth = `
SELECT p.id::text, format('%s/%s/%s/%s', p.reactions, p.clean, p.votes, p.points), format('%s/%s/%s/%s', t.r, t.c, t.v, t.p)
FROM posts p CROSS JOIN LATERAL (
  SELECT count(*) FILTER (WHERE v.user_id IS NOT NULL AND v.kind IN ('like', 'love') AND v.status <> 3) AS r,
         count(*) FILTER (WHERE v.kind NOT IN ('spam') AND v.up = true) AS c,
         coalesce(sum(CASE WHEN v.up THEN 1 WHEN NOT v.up THEN -1 END), 0) AS v,
         coalesce(sum(v.total), 0) AS p
  FROM votes v WHERE v.post_id = p.id) t
WHERE (p.reactions, p.clean, p.votes, p.points) <> (t.r, t.c, t.v, t.p)
ORDER BY p.id`

// kindsOp is one write of an app whose votes change kind, status, user,
// direction and weights, move between posts and are deleted.
func kindsOp(ctx context.Context, w *workload, rng *rand.Rand) error {
	kinds := []any{"like", "love", "spam", "meh", nil}
	maybe := func(v any) any {
		if rng.IntN(5) == 0 {
			return nil
		}
		return v
	}
	pick := "(SELECT id FROM votes WHERE post_id = $1 ORDER BY random() LIMIT 1)"
	var err error
	switch k := rng.IntN(100); {
	case k < 30:
		_, err = w.db.Exec(ctx, `INSERT INTO votes (post_id, user_id, kind, status, up, base, bonus) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			w.post(rng), maybe(rng.Int64N(1000)), kinds[rng.IntN(len(kinds))], maybe(rng.IntN(4)), maybe(rng.IntN(2) == 0), maybe(rng.IntN(21)-10), maybe(rng.IntN(7)))
	case k < 40:
		_, err = w.db.Exec(ctx, "UPDATE votes SET kind = $2 WHERE id = "+pick, w.post(rng), kinds[rng.IntN(len(kinds))])
	case k < 48:
		_, err = w.db.Exec(ctx, "UPDATE votes SET status = $2 WHERE id = "+pick, w.post(rng), maybe(rng.IntN(4)))
	case k < 56:
		_, err = w.db.Exec(ctx, "UPDATE votes SET up = NOT up WHERE id = "+pick, w.post(rng))
	case k < 62:
		_, err = w.db.Exec(ctx, "UPDATE votes SET user_id = CASE WHEN user_id IS NULL THEN 5 END WHERE id = "+pick, w.post(rng))
	case k < 70:
		_, err = w.db.Exec(ctx, "UPDATE votes SET base = $2, bonus = $3 WHERE id = "+pick, w.post(rng), maybe(rng.IntN(21)-10), maybe(rng.IntN(7)))
	case k < 78:
		_, err = w.db.Exec(ctx, "UPDATE votes SET post_id = $2 WHERE id = "+pick, w.post(rng), w.post(rng))
	case k < 90:
		_, err = w.db.Exec(ctx, "DELETE FROM votes WHERE id = "+pick, w.post(rng))
	default: // several at once, sometimes rolled back
		err = w.tx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE votes SET kind = 'love', status = 1, up = true, base = base + 1 WHERE id = "+pick, w.post(rng)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE votes SET post_id = $2, user_id = NULL WHERE id = "+pick, w.post(rng), w.post(rng)); err != nil {
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

func kindsLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	w := newWorkload(e.db)
	w.posts = 30
	w.runOps(ctx, t, clients, ops, kindsOp)
}

// TestFilterBoolAndDerivedKinds keeps the four counters of kindsConfig
// exact: a backfill of rows that exist before walcount starts while the
// app writes, a crash after a flush's commit under load, drift that
// reconciliation corrects, and the replica identity lost and restored
// (degraded, dirty, repaired by itself).
func TestFilterBoolAndDerivedKinds(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, kindsSchema, func(e *env) { e.cfg = e.loadConfig(kindsConfig) })
	ctx := context.Background()

	// A backfill on live tables, a crash after a commit, more churn.
	d := e.crashInBackfill(8, func(clients, ops int) { kindsLoad(ctx, t, e, clients, ops) })
	e.waitCaughtUp(catchUp)
	e.assertNone("after the backfill, a crash and churn", kindsTruth)

	// Drift, corrected by a reconciliation while the app writes.
	e.exec("UPDATE posts SET reactions = reactions + 3, clean = clean - 1, votes = votes + 7, points = points - 11 WHERE id IN (2, 9, 17)")
	var wg sync.WaitGroup
	wg.Go(func() { kindsLoad(ctx, t, e, 2, 100) })
	run := startRun(t, d, reconcile.Request{})
	got := waitRun(t, d, run.ID)
	wg.Wait()
	if got.Status != "done" || got.Corrected == 0 {
		t.Fatalf("reconciliation %+v, want done with corrections", got)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after reconciliation", kindsTruth)

	// The identity lost under load: degraded and dirty, repaired once it
	// is back.
	e.exec("ALTER TABLE votes REPLICA IDENTITY DEFAULT")
	kindsLoad(ctx, t, e, 2, 60)
	waitFor(t, "the counters degraded", func() bool { return len(d.d.Status(ctx).Degraded) == 4 })
	e.exec("ALTER TABLE votes REPLICA IDENTITY FULL")
	kindsLoad(ctx, t, e, 2, 60)
	e.waitClean(t, 2*time.Minute)
	e.assertNone("after the identity came back", kindsTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

const totalsSchema = `
CREATE TABLE site (id integer PRIMARY KEY, posts bigint NOT NULL DEFAULT 0, live bigint NOT NULL DEFAULT 0,
  score bigint NOT NULL DEFAULT 0);
INSERT INTO site (id) VALUES (1);
CREATE TABLE posts (id bigserial PRIMARY KEY, deleted boolean NOT NULL DEFAULT false, up boolean);
ALTER TABLE posts REPLICA IDENTITY FULL;
INSERT INTO posts (deleted, up) SELECT g % 5 = 0, CASE WHEN g % 3 <> 0 THEN g % 2 = 0 END FROM generate_series(1, 500) g;
`

const totalsConfig = testSettings + `
counters:
  - {name: site_posts, source: posts, target: site, target_key: id, target_row: 1, column: posts}
  - {name: site_live, source: posts, target: site, target_key: id, target_row: 1, column: live, where: { deleted: false }}
  - {name: site_score, source: posts, target: site, target_key: id, target_row: 1, column: score, sum: up}
`

const totalsTruth = `
SELECT s.id::text, format('%s/%s/%s', s.posts, s.live, s.score), format('%s/%s/%s', t.n, t.l, t.v)
FROM site s CROSS JOIN (SELECT count(*) AS n, count(*) FILTER (WHERE NOT deleted) AS l,
  coalesce(sum(CASE WHEN up THEN 1 WHEN NOT up THEN -1 END), 0) AS v FROM posts) t
WHERE (s.posts, s.live, s.score) <> (t.n, t.l, t.v)`

func totalsLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	w := newWorkload(e.db)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c+7), uint64(time.Now().UnixNano())))
			pick := "(SELECT id FROM posts WHERE id >= $1 ORDER BY id LIMIT 1)"
			for range ops {
				var err error
				switch k := rng.IntN(10); {
				case k < 4:
					_, err = e.db.Exec(ctx, "INSERT INTO posts (deleted, up) VALUES ($1, $2)", rng.IntN(4) == 0, []any{true, false, nil}[rng.IntN(3)])
				case k < 6:
					_, err = e.db.Exec(ctx, "UPDATE posts SET deleted = NOT deleted WHERE id = "+pick, rng.Int64N(2000))
				case k < 8:
					_, err = e.db.Exec(ctx, "UPDATE posts SET up = NOT up WHERE id = "+pick, rng.Int64N(2000))
				default:
					_, err = e.db.Exec(ctx, "DELETE FROM posts WHERE id = "+pick, rng.Int64N(2000))
				}
				if err != nil {
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

// TestTotalsWithNoKey keeps site-wide totals (a count, a filtered count and
// a boolean sum, all into the one row of site) exact: the backfill of rows
// that exist before walcount starts while the app writes, a crash after a
// flush's commit, drift that reconciliation corrects, the row held by the
// app while walcount flushes (carried, then applied), and a TRUNCATE of
// the source.
func TestTotalsWithNoKey(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, totalsSchema, func(e *env) { e.cfg = e.loadConfig(totalsConfig) })
	ctx := context.Background()
	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, 6)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	var wg sync.WaitGroup
	wg.Go(func() { totalsLoad(ctx, t, e, 3, 200) })
	if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	disarm()
	d = e.start()
	wg.Wait()
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after the backfill, a crash and churn", totalsTruth)

	// The app holds the hot row while posts keep coming: the flush
	// carries the total and applies it once the row is free.
	held, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Rollback(context.Background()) })
	if _, err := held.Exec(ctx, "SELECT 1 FROM site WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	totalsLoad(ctx, t, e, 2, 100)
	waitFor(t, "the total carried", func() bool { return len(e.carried()) > 0 })
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.waitCaughtUp(catchUp)
	e.assertNone("after the row was held", totalsTruth)

	e.exec("UPDATE site SET posts = posts + 5, live = 0, score = score - 2")
	run := startRun(t, d, reconcile.Request{})
	if got := waitRun(t, d, run.ID); got.Status != "done" || got.Corrected != 3 {
		t.Fatalf("reconciliation %+v, want done with 3 corrections", got)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after reconciliation", totalsTruth)

	e.inTransaction("INSERT INTO posts (up) VALUES (true), (false)", "TRUNCATE posts", "INSERT INTO posts (up, deleted) VALUES (true, false), (true, true), (NULL, false)")
	totalsLoad(ctx, t, e, 2, 50)
	e.waitCaughtUp(catchUp)
	e.assertNone("after a TRUNCATE", totalsTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

const appendOnlySchema = `
CREATE TABLE accounts (id bigint PRIMARY KEY, events bigint NOT NULL DEFAULT 0, total bigint NOT NULL DEFAULT 0);
INSERT INTO accounts (id) SELECT g FROM generate_series(1, 10) g;
CREATE TABLE history (id bigserial PRIMARY KEY, account_id bigint NOT NULL, delta integer NOT NULL);
INSERT INTO history (account_id, delta) SELECT 1 + g % 10, g % 11 - 5 FROM generate_series(1, 400) g;
`

const appendOnlyConfig = testSettings + `
counters:
  - {name: account_events, source: history, key: account_id, target: accounts, target_key: id, column: events, append_only: true}
  - {name: account_total, source: history, key: account_id, target: accounts, target_key: id, column: total, sum: delta, append_only: true}
`

const appendOnlyTruth = `
SELECT a.id::text, format('%s/%s', a.events, a.total), format('%s/%s', count(h.id), coalesce(sum(h.delta), 0))
FROM accounts a LEFT JOIN history h ON h.account_id = a.id GROUP BY a.id
HAVING (a.events, a.total) <> (count(h.id), coalesce(sum(h.delta), 0))`

func historyLoad(ctx context.Context, t testing.TB, e *env, clients, ops int) {
	t.Helper()
	var wg sync.WaitGroup
	var bad atomicInt
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c+11), uint64(time.Now().UnixNano())))
			for range ops {
				if _, err := e.db.Exec(ctx, "INSERT INTO history (account_id, delta) VALUES ($1, $2), ($3, $4)",
					1+rng.Int64N(10), rng.IntN(21)-10, 1+rng.Int64N(10), rng.IntN(21)-10); err != nil {
					bad.add()
				}
			}
		})
	}
	wg.Wait()
	if bad.load() > 0 {
		t.Fatalf("%d inserts failed", bad.load())
	}
}

type atomicInt struct {
	mu sync.Mutex
	n  int
}

func (a *atomicInt) add()      { a.mu.Lock(); a.n++; a.mu.Unlock() }
func (a *atomicInt) load() int { a.mu.Lock(); defer a.mu.Unlock(); return a.n }

// TestAppendOnlySource counts an event log whose replica identity is its
// primary key alone (the counters' columns are not in it): append_only
// needs none. A backfill of the rows that exist while inserts go on, a
// crash after a flush's commit, then stray UPDATEs and DELETEs: they are
// not counted, the counters are marked dirty and repaired by themselves.
func TestAppendOnlySource(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appendOnlySchema, func(e *env) { e.cfg = e.loadConfig(appendOnlyConfig) })
	ctx := context.Background()
	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, 5)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	var wg sync.WaitGroup
	wg.Go(func() { historyLoad(ctx, t, e, 3, 200) })
	if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	disarm()
	d = e.start()
	wg.Wait()
	if run := waitRun(t, d, 0); run.Status != "done" {
		t.Fatalf("backfill %+v, want done", run)
	}
	e.waitCaughtUp(catchUp)
	e.assertNone("after the backfill, a crash and inserts", appendOnlyTruth)
	if st := d.d.Status(ctx); len(st.Dirty) != 0 || len(st.Degraded) != 0 {
		t.Fatalf("an insert-only load left dirty %v, degraded %v", st.Dirty, st.Degraded)
	}

	// Stray changes of a table declared append_only, while inserts go on.
	wg.Go(func() { historyLoad(ctx, t, e, 2, 100) })
	e.exec("UPDATE history SET account_id = 3 WHERE id IN (SELECT id FROM history WHERE account_id = 4 LIMIT 5)")
	e.exec("DELETE FROM history WHERE id IN (SELECT id FROM history WHERE account_id = 7 LIMIT 9)")
	e.exec("UPDATE history SET delta = delta + 100 WHERE account_id = 1")
	wg.Wait()
	e.waitClean(t, 2*time.Minute)
	e.assertNone("after stray updates and deletes", appendOnlyTruth)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestDerivedValueOverCounters keeps a value derived from two of
// walcount's counters as a STORED generated column of the target (a
// controversy rank from up- and downvotes): every flush that changes a
// counter recomputes it in the same row update, so it is exact whenever
// the counters are.
func TestDerivedValueOverCounters(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, `
CREATE TABLE posts (id bigint PRIMARY KEY, ups bigint NOT NULL DEFAULT 0, downs bigint NOT NULL DEFAULT 0,
  controversy bigint GENERATED ALWAYS AS (least(ups, downs) * 2 - abs(ups - downs)) STORED);
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint, user_id bigint, kind text, status smallint,
  up boolean, base integer, bonus integer);
ALTER TABLE votes REPLICA IDENTITY FULL;
INSERT INTO posts (id) SELECT g FROM generate_series(1, 30) g;`, func(e *env) {
		e.cfg = e.loadConfig(testSettings + `
counters:
  - {name: post_ups, source: votes, key: post_id, target: posts, target_key: id, column: ups, where: { up: true }}
  - {name: post_downs, source: votes, key: post_id, target: posts, target_key: id, column: downs, where: { up: false }}
`)
	})
	d := e.start()
	kindsLoad(context.Background(), t, e, 3, 200)
	e.waitCaughtUp(catchUp)
	e.assertNone("derived rank", `
SELECT p.id::text, format('%s/%s/%s', p.ups, p.downs, p.controversy), format('%s/%s/%s', t.u, t.d, least(t.u, t.d) * 2 - abs(t.u - t.d))
FROM posts p CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE v.up) AS u, count(*) FILTER (WHERE NOT v.up) AS d FROM votes v WHERE v.post_id = p.id) t
WHERE (p.ups, p.downs, p.controversy) <> (t.u, t.d, least(t.u, t.d) * 2 - abs(t.u - t.d))`)
	e.assertHealthy(d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
