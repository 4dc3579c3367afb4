package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// appSchema is the app's tables with the columns the app itself edits: a
// post's title, and whether it is archived.
var appSchema = appschema.SQL(appschema.Options{
	PostsColumns: "title text NOT NULL DEFAULT '', archived boolean NOT NULL DEFAULT false",
	LikesColumns: likedBy, Posts: 50}) + eventsTable

var roleSeq atomic.Int64

// walcountRole makes the role walcount runs as in production, with only
// the privileges it needs (LOGIN REPLICATION, SELECT on likes, SELECT of
// the key and the column and UPDATE of the column on posts, walcount's
// state), and points e.cfg at it for the daemons started next. It returns
// the role's name.
func (e *env) walcountRole() string {
	e.t.Helper()
	ctx := context.Background()
	role := fmt.Sprintf("walcount_run_%d_%d", time.Now().UnixNano()%1e9, roleSeq.Add(1))
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN REPLICATION",
		"GRANT SELECT ON likes TO " + role,
		"GRANT SELECT (id, likes_count), UPDATE (likes_count) ON posts TO " + role,
		state.AccessGrants(role),
	} {
		if _, err := e.db.Exec(ctx, q); err != nil {
			e.t.Fatalf("%s: %v", q, err)
		}
	}
	e.t.Cleanup(func() {
		_, _ = e.db.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = e.db.Exec(context.Background(), "DROP ROLE "+role)
	})
	if !strings.Contains(e.cfg.DatabaseURL, "postgres@") {
		e.t.Fatalf("cannot make a URL for role %s from %s", role, e.cfg.DatabaseURL)
	}
	e.cfg.DatabaseURL = strings.Replace(e.cfg.DatabaseURL, "postgres@", role+"@", 1)
	return role
}

// likeLoad inserts likes on random posts among posts, one per statement,
// until ctx is done.
func likeLoad(ctx context.Context, db *pgxpool.Pool, seed uint64, posts []int64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for ctx.Err() == nil {
		_, _ = db.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1)", posts[rng.IntN(len(posts))])
	}
}

func postRange(lo, hi int64) []int64 {
	var out []int64
	for p := lo; p <= hi; p++ {
		out = append(out, p)
	}
	return out
}

// holdRow begins a transaction that holds post's row with lock (an admin
// edit in a slow transaction); the caller rolls it back.
func (e *env) holdRow(post int64, lock string) pgx.Tx {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.db.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "SELECT 1 FROM posts WHERE id = $1 "+lock, post); err != nil {
		e.t.Fatal(err)
	}
	return tx
}

// carried returns walcount.carried of the env's slot.
func (e *env) carried() []state.Carried {
	e.t.Helper()
	c, err := state.LoadCarried(context.Background(), e.db, e.cfg.Slot)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func carriedKey(cs []state.Carried, key string) *state.Carried {
	for i := range cs {
		if cs[i].Key == key {
			return &cs[i]
		}
	}
	return nil
}

// assertExactBut fails unless every post but except is exact.
func (e *env) assertExactBut(except ...int64) {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), `
SELECT p.id, p.likes_count, count(l.id)
FROM posts p LEFT JOIN likes l ON l.post_id = p.id
WHERE p.id <> ALL ($1)
GROUP BY p.id, p.likes_count
HAVING p.likes_count <> count(l.id)
ORDER BY p.id`, except)
	if err != nil {
		e.t.Fatal(err)
	}
	type off struct{ ID, Cached, Truth int64 }
	bad, err := pgx.CollectRows(rows, pgx.RowToStructByPos[off])
	if err != nil {
		e.t.Fatal(err)
	}
	if len(bad) > 0 {
		e.t.Fatalf("%d posts other than %v are off: %v", len(bad), except, bad)
	}
}

// waitNoCarried waits until no key is carried, making flushes happen.
func (e *env) waitNoCarried() {
	e.t.Helper()
	poll(e.t, "no carried key", func() (bool, string) {
		e.waitCaughtUp(catchUp)
		c := e.carried()
		return len(c) == 0, fmt.Sprintf("%d carried: %+v", len(c), c)
	})
}

func sessionFailures(r *running) float64 {
	var n float64
	for _, stage := range []string{"start", "streaming"} {
		n += float64(counterValue(r.d.m.SessionFailures.WithLabelValues(stage)))
	}
	return n
}

// TestLockedRowDoesNotFreezeOthers: the app holds one post's row for a
// long transaction while likes go to every post. Before, the flush waited
// for that row holding the locks of every other post of its chunk: the
// app's single-row updates of other posts waited behind it, and no counter
// moved until the app committed. Now the flush applies what it can lock
// at once and carries post 1 until the row is free.
func TestLockedRowDoesNotFreezeOthers(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema, nil)
	e.walcountRole()
	d := e.start()
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)

	holder := e.holdRow(1, "FOR UPDATE")
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Go(func() { likeLoad(loadCtx, e.db, uint64(c), postRange(1, 50)) })
	}
	// Another app client edits other posts' titles, one row a statement,
	// and measures how long each waits.
	var maxWait atomic.Int64
	var edits atomic.Int64
	wg.Go(func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			post := int64(2 + i%49)
			start := time.Now()
			if _, err := e.db.Exec(ctx, "UPDATE posts SET title = $2 WHERE id = $1", post, fmt.Sprint(i)); err != nil {
				t.Errorf("title update: %v", err)
				return
			}
			took := time.Since(start)
			edits.Add(1)
			if int64(took) > maxWait.Load() {
				maxWait.Store(int64(took))
			}
		}
	})
	poll(t, "post 1 carried and named in /status", func() (bool, string) {
		st := d.d.Status(ctx)
		if st.Carried == nil || st.Carried.Oldest == nil {
			return false, fmt.Sprintf("%+v", st.Carried)
		}
		return st.Carried.Oldest.Key == "1" && st.Carried.Deferred == 1, fmt.Sprintf("%+v", *st.Carried.Oldest)
	})
	// The checkpoint keeps moving while the row is held, under load.
	e.waitCaughtUp(catchUp)
	e.waitCaughtUp(catchUp)
	stopLoad()
	wg.Wait()
	e.waitCaughtUp(catchUp)
	e.assertExactBut(1)
	if w := time.Duration(maxWait.Load()); w > 2*time.Second {
		t.Errorf("an app update of another post waited %s behind the flush", w)
	}
	t.Logf("%d title edits of other posts, the longest took %s", edits.Load(), time.Duration(maxWait.Load()))
	// The gauge is sampled (every MetricsInterval, and by /status): the
	// last sample may be from the load, when a flush also carried a post
	// whose row the title editor held for its UPDATE (SKIP LOCKED, as it
	// should). Once the edits stopped and the flushes caught up, post 1
	// is the one key carried: /status samples afresh.
	if st := d.d.Status(ctx); st.Carried == nil || st.Carried.Deferred != 1 || st.Carried.Oldest.Key != "1" {
		t.Errorf("carried after the load = %+v, want post 1 alone", st.Carried)
	}
	if got := gaugeValue(d.d.m.FlushKeysDeferred); got != 1 {
		t.Errorf("walcount_flush_keys_deferred = %v, want 1", got)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.assertExact()
	if n := sessionFailures(d); n != 0 {
		t.Errorf("%v failed sessions", n)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestNoDeadlockWithApp: one app client updates two hot posts in random
// order (it cannot deadlock with itself) while likes go to both. Before,
// the flush locked one of them and waited for the other, and PostgreSQL
// broke the cycle by failing the app's transaction (40P01) or walcount's
// session. Now the flush never waits for a row lock.
func TestNoDeadlockWithApp(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema, nil)
	e.walcountRole()
	d := e.start()
	ctx := context.Background()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Go(func() { likeLoad(loadCtx, e.db, uint64(c), []int64{1, 2}) })
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var deadlocks, other int
	const txns = 600
	for i := range txns {
		a, b := int64(1), int64(2)
		if rng.IntN(2) == 0 {
			a, b = b, a
		}
		err := pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE posts SET title = $2 WHERE id = $1", a, fmt.Sprint(i)); err != nil {
				return err
			}
			// The app's think time between its two updates.
			if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.003)"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "UPDATE posts SET title = $2 WHERE id = $1", b, fmt.Sprint(i))
			return err
		})
		var pe *pgconn.PgError
		switch {
		case err == nil:
		case errors.As(err, &pe) && pe.Code == "40P01":
			deadlocks++
		default:
			other++
			t.Logf("app transaction failed: %v", err)
		}
	}
	stopLoad()
	wg.Wait()
	if deadlocks > 0 || other > 0 {
		t.Errorf("%d of %d app transactions failed with a deadlock (40P01), %d otherwise", deadlocks, txns, other)
	}
	e.waitNoCarried()
	e.assertExact()
	if n := sessionFailures(d); n != 0 {
		t.Errorf("%v walcount sessions failed (last error: %v)", n, d.d.Status(ctx).LastError)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCarriedKeyCrash crashes walcount at each point of a flush while a
// key is carried (its row held by the app), with likes on it and on
// others before and after; a new daemon must apply everything exactly
// once, the carried key once its row is free.
func TestCarriedKeyCrash(t *testing.T) {
	t.Parallel()
	for _, point := range []string{failpoint.BeforeCommit, failpoint.AfterCommit, failpoint.BeforeAck} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			e := newEnvWith(t, appSchema, nil)
			e.walcountRole()
			fp := &failpoint.Set{}
			d := e.start(func(o *Options) { o.Failpoints = fp })
			ctx := context.Background()
			holder := e.holdRow(1, "FOR UPDATE")
			if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 10), generate_series(1, 3) p"); err != nil {
				t.Fatal(err)
			}
			poll(t, "post 1 carried", func() (bool, string) {
				c := e.carried()
				return carriedKey(c, "1") != nil, fmt.Sprintf("%+v", c)
			})
			disarm := fp.CrashAfter(point, 1)
			defer disarm()
			if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 4), generate_series(1, 3) p"); err != nil {
				t.Fatal(err)
			}
			if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
				t.Fatalf("daemon returned %v, want the simulated crash", err)
			}
			disarm()
			if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 2), generate_series(1, 5) p"); err != nil {
				t.Fatal(err)
			}
			d2 := e.start()
			e.waitCaughtUp(catchUp)
			e.assertExactBut(1)
			if c := carriedKey(e.carried(), "1"); c == nil || c.Delta != 10+4+2 {
				t.Errorf("post 1 carried as %+v, want a delta of 16", c)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			e.waitNoCarried()
			e.assertExact()
			if err := d2.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// readOnlySchema is appSchema with the trigger that makes archived posts
// read-only, while archive_policy enforces it.
var readOnlySchema = appSchema + `
CREATE TABLE archive_policy (enforce boolean NOT NULL);
INSERT INTO archive_policy VALUES (true);
CREATE FUNCTION posts_read_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.archived AND (SELECT enforce FROM archive_policy) THEN
    RAISE EXCEPTION 'post % is archived and read-only', OLD.id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER posts_read_only BEFORE UPDATE ON posts FOR EACH ROW EXECUTE FUNCTION posts_read_only();
`

// TestTriggerParksKey: a BEFORE UPDATE trigger refuses every update of an
// archived post, and an unlike reaches one. Before, the flush failed on
// it forever and every counter froze. Now post 50 is parked, visible, and
// written once the trigger allows it; the other posts stay exact.
func TestTriggerParksKey(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, readOnlySchema, nil)
	role := e.walcountRole()
	ctx := context.Background()
	// The trigger reads the policy as the role that updates the post.
	if _, err := e.db.Exec(ctx, "GRANT SELECT ON archive_policy TO "+role); err != nil {
		t.Fatal(err)
	}
	d := e.start(func(o *Options) { o.ParkRetry = 300 * time.Millisecond })
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 3), generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	e.inTransaction("UPDATE posts SET archived = true WHERE id = 50",
		"DELETE FROM likes WHERE id = (SELECT min(id) FROM likes WHERE post_id = 50)")
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 2), generate_series(1, 49) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	e.assertExactBut(50)
	poll(t, "post 50 parked in /status with the trigger's error, and marked dirty", func() (bool, string) {
		st := d.d.Status(ctx)
		if st.Carried == nil || len(st.Carried.ParkedKeys) != 1 {
			return false, fmt.Sprintf("%+v", st.Carried)
		}
		p := st.Carried.ParkedKeys[0]
		var marked bool
		if err := e.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM walcount.dirty WHERE key = '50')
  OR EXISTS (SELECT 1 FROM walcount.reconcile_runs WHERE kind = 'dirty' AND '50' = ANY (keys))`).Scan(&marked); err != nil {
			return false, err.Error()
		}
		return p.Key == "50" && p.Delta == -1 && strings.Contains(p.Parked, "archived and read-only") &&
			strings.Contains(p.Parked, "P0001") && marked && gaugeValue(d.d.m.KeysParked) == 1, fmt.Sprintf("%+v, marked %v", p, marked)
	})
	// The others keep moving.
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 49) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	e.assertExactBut(50)
	if _, err := e.db.Exec(ctx, "UPDATE archive_policy SET enforce = false"); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.assertExact()
	if n := sessionFailures(d); n != 0 {
		t.Errorf("%v failed sessions", n)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCheckConstraintParksKey: CHECK (likes_count >= 0) refuses a delta
// that would take a column below zero (a column that is off, as before a
// backfill reached it). The key is parked, the others go on, and a
// reconciliation, which counts the parked delta, repairs it.
func TestCheckConstraintParksKey(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema+`ALTER TABLE posts ADD CHECK (likes_count >= 0);`, nil)
	e.walcountRole()
	d := e.start(func(o *Options) { o.ParkRetry = 300 * time.Millisecond })
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 3), generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	// Post 7's column is off (0 for 3 likes), and an unlike arrives.
	if _, err := e.db.Exec(ctx, "UPDATE posts SET likes_count = 0 WHERE id = 7"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	if _, err := e.db.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT min(id) FROM likes WHERE post_id = 7)"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT min(id) FROM likes WHERE post_id = 8)"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	e.assertExactBut(7)
	poll(t, "post 7 parked on the CHECK", func() (bool, string) {
		c := carriedKey(e.carried(), "7")
		return c != nil && strings.Contains(c.Parked, "23514"), fmt.Sprintf("%+v", c)
	})
	run := startRun(t, d, reconcile.Request{})
	if got := waitRun(t, d, run.ID); got.Status != state.StatusDone {
		t.Fatalf("run %+v", got)
	}
	e.waitNoCarried()
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileCountsCarried: a reconciliation while a key is carried
// must see the carried delta as part of the column (it is below W), not
// as drift to correct: a correction would count it twice once the row is
// free.
func TestReconcileCountsCarried(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema, nil)
	e.walcountRole()
	d := e.start()
	ctx := context.Background()
	e.waitCaughtUp(catchUp)
	holder := e.holdRow(3, "FOR UPDATE")
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 5), generate_series(1, 9) p"); err != nil {
		t.Fatal(err)
	}
	poll(t, "post 3 carried", func() (bool, string) {
		c := e.carried()
		return carriedKey(c, "3") != nil, fmt.Sprintf("%+v", c)
	})
	for _, req := range []reconcile.Request{{}, {BatchSize: 4}} {
		run := startRun(t, d, req)
		got := waitRun(t, d, run.ID)
		if got.Status != state.StatusDone || got.Drifted != 0 || got.Corrected != 0 {
			t.Errorf("run with a carried key: %+v, want no drift", got)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestRoleTimeoutsDoNotWedge: walcount's role has lock_timeout,
// statement_timeout and idle_in_transaction_session_timeout of 1 ms in the
// database, and a trigger makes every update of a post take 10 ms.
// walcount sets its own values for its sessions and keeps every counter
// exact.
func TestRoleTimeoutsDoNotWedge(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema+`
CREATE FUNCTION posts_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
CREATE TRIGGER posts_slow BEFORE UPDATE ON posts FOR EACH ROW EXECUTE FUNCTION posts_slow();`, nil)
	role := e.walcountRole()
	ctx := context.Background()
	var db string
	if err := e.db.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, setting := range []string{"lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"} {
		if _, err := e.db.Exec(ctx, fmt.Sprintf("ALTER ROLE %s IN DATABASE %s SET %s = '1ms'", role, pgx.Identifier{db}.Sanitize(), setting)); err != nil {
			t.Fatal(err)
		}
	}
	d := e.start()
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 3), generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if n := sessionFailures(d); n != 0 {
		t.Errorf("%v walcount sessions failed (last error: %v)", n, d.d.Status(ctx).LastError)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCheckAtAdoption: walcount starts on posts whose likes it never saw
// (likes_count 0 for 3 likes each), with CHECK (likes_count >= 0), while
// users unlike old likes. An unlike reaching a post before the backfill
// does fails the CHECK; before, the flush failed on it forever and the
// backfill, which waits for the checkpoint, never ran. Now the key is
// parked, the backfill's correction joins its parked delta, and every post
// ends exact.
func TestCheckAtAdoption(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema+`ALTER TABLE posts ADD CHECK (likes_count >= 0);`, nil)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 3), generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Run(ctx, conn, setup.Options{Config: e.cfg, RecreateSlot: true}); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	e.walcountRole()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var unlikes atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(3, 4))
		for loadCtx.Err() == nil && unlikes.Load() < 60 {
			tag, err := e.db.Exec(loadCtx, "DELETE FROM likes WHERE id = (SELECT min(id) FROM likes WHERE post_id = $1)", 1+rng.IntN(50))
			if err == nil {
				unlikes.Add(tag.RowsAffected())
			}
			// Paced, so that the unlikes spread over several flushes
			// (a load generator's pace, not a wait).
			time.Sleep(5 * time.Millisecond)
		}
	}()
	core, logs := observer.New(zapcore.InfoLevel)
	d := e.start(func(o *Options) { o.ParkRetry = 300 * time.Millisecond; o.Logger = zap.New(core) })
	<-done
	t.Logf("%d unlikes of old likes during the start", unlikes.Load())
	if got := waitRun(t, d, 0); got.Status != state.StatusDone {
		t.Fatalf("last run %+v", got)
	}
	e.waitNoCarried()
	poll(t, "every post exact and no dirty mark left", func() (bool, string) {
		e.waitCaughtUp(catchUp)
		var off, marks int
		if err := e.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)),
  (SELECT count(*) FROM walcount.dirty)`).Scan(&off, &marks); err != nil {
			return false, err.Error()
		}
		return off == 0 && marks == 0 && d.d.ReconcileStatus().Current == nil, fmt.Sprintf("%d posts off, %d dirty marks", off, marks)
	})
	e.assertExact()
	if n := logs.FilterMessageSnippet("cannot be written and is parked").Len(); n == 0 {
		t.Errorf("no key was parked: the test did not make an unlike reach a post before the backfill")
	} else {
		t.Logf("%d keys parked on the CHECK before the backfill reached them", n)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestTruncateWhileRowHeld: a TRUNCATE of likes while the app holds one
// post's row. Before, the barrier's reset waited for that row holding the
// locks of every other post it had reset, and failed at lock_timeout,
// again and again until the row was free. Now it resets the rows it can
// lock and carries the reset of the held one (minus its column) to the
// next flush.
func TestTruncateWhileRowHeld(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, appSchema, nil)
	e.walcountRole()
	d := e.start()
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 3), generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	holder := e.holdRow(1, "FOR UPDATE")
	e.inTransaction(
		"INSERT INTO likes (post_id) VALUES (1), (2)",
		"TRUNCATE likes",
		"INSERT INTO likes (post_id) VALUES (1), (1), (3), (3)",
	)
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT p FROM generate_series(1, 2), generate_series(1, 50) p"); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(catchUp)
	e.assertExactBut(1)
	if c := carriedKey(e.carried(), "1"); c == nil || c.Delta != -3+2+2 {
		t.Errorf("post 1 carried as %+v, want the reset of its 3 likes and its 4 new ones (+1)", c)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitNoCarried()
	e.assertExact()
	if n := sessionFailures(d); n != 0 {
		t.Errorf("%v failed sessions (last error: %v)", n, d.d.Status(ctx).LastError)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
