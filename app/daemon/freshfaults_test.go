package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jackc/pglogrepl"
	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// freshFaultSchema is the workload's posts and likes with a weight to sum
// and a column for its max, and posts 101 to 104, which only the fresh
// read checkers touch.
var freshFaultSchema = appschema.SQL(appschema.Options{
	PostsColumns: "score numeric(12,2) NOT NULL DEFAULT 0, top_w numeric(10,2)",
	LikesColumns: likedBy + ", w numeric(10,2) NOT NULL DEFAULT 0", Index: true, Posts: 50}) + eventsTable + `
INSERT INTO posts (id) SELECT g FROM generate_series(101, 104) g;`

const freshFaultCounters = `
on_slot_loss: recreate
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_score, source: likes, key: post_id, target: posts, target_key: id, column: score, sum: w}
  - {name: post_top, source: likes, key: post_id, target: posts, target_key: id, column: top_w, max: w}
`

// TestFreshReadsExactThroughFaults is issue 39's read-your-writes test
// with faults: four checkers write to posts only they touch (a like with
// a weight, or the delete of one) and after every commit read the post
// with min_lsn = the WAL position after it, through the daemon's HTTP API
// as `walcount run` serves it, and require value = COUNT(*) and the sum,
// while the workload churns the other posts and the test, in turn,
// corrects drift with a reconciliation (POST /v1/reconcile), fails Redis
// over (Sentinel, the replica cut off and behind), drops the slot under
// the daemon (on_slot_loss: recreate repairs it), fails PostgreSQL over to
// a synchronous standby (a failover slot from 17 on, a lost slot
// recreated before), and reconciles again on the new primary. An answer
// must be exact, or 503 or 504 (asked again), or say dirty while a repair
// runs (asked again): never a wrong value. The max counter is refused
// with 422 all along (docs/fresh-reads.md).
func TestFreshReadsExactThroughFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	user := walcountUser(t, "redis+sentinel://h:1/walcount")
	s := testenv.RedisSentinel(t, servers.RedisSentinelOptions{MasterName: "walcount", Replicas: 1, Sentinels: 3,
		Users: []servers.RedisUser{user}, SentinelPassword: "sentinel-pw"})
	e := newEnvWith(t, freshFaultSchema, func(e *env) {
		e.cfg = e.loadConfig(testSettings + freshFaultCounters)
		e.cfg.RedisURL = s.URL()
	})
	if e.cfg.OnSlotLoss != config.SlotLossRecreate {
		t.Fatalf("on_slot_loss %q", e.cfg.OnSlotLoss)
	}
	standby := synchronousStandby(t, e)

	d := e.start()
	waitRun(t, d, 0) // the first start's backfill

	ck := &freshChecker{db: e.db, base: serveFresh(t, d)}
	cctx, stopCheckers := context.WithCancel(ctx)
	var checkers sync.WaitGroup
	for i := range 4 {
		checkers.Go(func() { ck.loop(cctx, int64(101+i)) })
	}
	defer func() { stopCheckers(); checkers.Wait() }()
	w := newWorkload(e.db)
	stopLoad := w.background(2, 20)
	defer stopLoad()
	ck.waitChecked(t, 40, "before any fault")

	began := time.Now()
	fault := func(name string, do func()) {
		t.Helper()
		at := time.Now()
		do()
		ck.waitChecked(t, 100, "after "+name)
		t.Logf("%s: done and 100 more reads checked %s after it began (%d checked so far, %d asked again, %d dirty answers)",
			name, time.Since(at).Round(time.Millisecond), ck.checked.Load(), ck.retried.Load(), ck.dirty.Load())
	}
	dropSlot := func() {
		repairs := e.dirtyRunsDone(t)
		wait.For(t, time.Minute, "the slot dropped", func() bool {
			_, _ = e.db.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", e.cfg.Slot)
			_, err := e.db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", e.cfg.Slot)
			return err == nil
		})
		wait.For(t, 2*time.Minute, "the repair of the recreated slot", func() bool { return e.dirtyRunsDone(t) > repairs })
	}
	fault("reconcile", func() { ck.reconcile(t, e, d) })
	fault("redis failover", func() { redisFailoverBehind(t, e, s, ck) })
	fault("slot dropped and recreated", dropSlot)
	fault("reconcile", func() { ck.reconcile(t, e, d) })
	fault("postgres failover", func() { postgresFailover(t, e, d, standby) })
	fault("slot dropped and recreated on the new primary", dropSlot)
	fault("reconcile on the new primary", func() { ck.reconcile(t, e, d) })

	stopCheckers()
	checkers.Wait()
	stopLoad()
	w.report(t)
	ck.report(t)
	t.Logf("PostgreSQL %d: the faults took %s", e.pg.Major(), time.Since(began).Round(time.Millisecond))
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// serveFresh serves d's fresh reads and reconciliations as `walcount run`
// does, on 127.0.0.1:0, until the test ends, and returns its base URL.
func serveFresh(t *testing.T, d *running) string {
	t.Helper()
	srv := httpapi.New(httpapi.Options{Addr: "127.0.0.1:0", Reconcile: d.d.ReconcileHandler(), Counters: d.d.FreshHandler(),
		Status: func(ctx context.Context) any { return d.d.Status(ctx) }, Ready: d.d.Ready})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return "http://" + srv.Addr()
}

// synchronousStandby starts a streaming standby of e's primary, makes it
// synchronous (a commit the app was told of survives the failover, so a
// checker's COUNT(*) stays true) and, from PostgreSQL 17 on, names it in
// synchronized_standby_slots; the app's pool and walcount then name both
// hosts with target_session_attrs=read-write.
func synchronousStandby(t *testing.T, e *env) *servers.Postgres {
	t.Helper()
	ctx := context.Background()
	standby, err := e.pg.StartStandby(ctx, servers.StandbyOptions{})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	if e.pg.Major() >= 17 {
		if err := e.pg.SetSynchronizedStandbySlots(ctx, standby.StandbySlot()); err != nil {
			t.Fatal(err)
		}
	}
	// The standby's start restarted the primary: a new pool, naming both.
	multi := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		e.pg.Port(), standby.Port())
	e.db.Close()
	if e.db, err = pgxpool.New(ctx, multi); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.db.Close)
	e.cfg.DatabaseURL = multi
	e.exec(fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '"%s"'`, servers.DefaultStandbyName))
	e.exec("SELECT pg_reload_conf()")
	wait.For(t, time.Minute, "the standby synchronous", func() bool {
		var n int
		return e.db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&n) == nil && n == 1
	})
	return standby
}

// redisFailoverBehind fails the Redis master over to a replica that
// lacks its last writes: the replica is stopped and cut off while the
// checkers read (their answers come from the master), then the master is
// killed, once W passed what it holds, and the sentinels promote the
// replica: walcount must find the loss and start a new chain.
func redisFailoverBehind(t *testing.T, e *env, s *servers.RedisSentinel, ck *freshChecker) {
	t.Helper()
	ctx := context.Background()
	addr, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	master := s.NodeByAddr(addr)
	var replica *servers.RedisNode
	for _, n := range s.Nodes() {
		if n != master {
			replica = n
		}
	}
	if err := syscall.Kill(replica.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(replica.PID(), syscall.SIGCONT); err != nil {
				t.Errorf("resume %s: %v", replica.Name(), err)
			}
		}
	}
	defer resume()
	if err := nodeClient(t, master, s.Admin()).ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	// Not long: the sentinels promote no replica whose link has been down
	// for ten times down-after-milliseconds.
	ck.waitChecked(t, 10, "from the master its replica no longer follows")
	// W passes what the master holds, so that the replica's copy of the
	// chain cannot continue it: walcount must find the loss.
	meta := buffer.KeysFor(e.cfg.Slot).Meta
	held, err := nodeClient(t, master, s.Admin()).HMGet(ctx, meta, "lsn", "epoch").Result()
	if err != nil {
		t.Fatal(err)
	}
	heldLSN, _ := held[0].(string)
	epoch, _ := held[1].(string)
	lsn, err := buffer.ParseLSN(heldLSN)
	if err != nil || epoch == "" {
		t.Fatalf("meta of the master: %v (%v)", held, err)
	}
	waitCheckpointPast(t, e, lsn, failoverWithin)
	if err := s.Kill(master); err != nil {
		t.Fatal(err)
	}
	resume()
	addr, err = s.WaitNewMaster(ctx, master.Addr())
	if err != nil {
		t.Fatalf("redis failover: %v", err)
	}
	wait.For(t, failoverWithin, "walcount to reset the chain the replica could not continue", func() bool {
		now, err := nodeClient(t, s.NodeByAddr(addr), s.Admin()).HGet(ctx, meta, "epoch").Result()
		return err == nil && now != epoch
	})
}

// postgresFailover kills the primary (-m immediate) once the standby holds
// walcount's failover slot (17+), promotes the standby, and waits for the
// daemon to stream from it.
func postgresFailover(t *testing.T, e *env, d *running, standby *servers.Postgres) {
	t.Helper()
	ctx := context.Background()
	if e.pg.Major() >= 17 {
		waitSynced(t, e, standby)
	}
	killed := time.Now()
	if err := e.pg.Stop(ctx, servers.StopImmediate); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("promote: %v", err)
	}
	waitFor(t, "walcount streaming from the new primary", func() bool {
		st := d.d.Status(ctx)
		return st.Streaming && st.SessionStart != nil && st.SessionStart.After(killed)
	})
}

// dirtyRunsDone counts the repairs (reconciliations of dirty marks) done.
func (e *env) dirtyRunsDone(t testing.TB) int {
	t.Helper()
	var n int
	_ = e.db.QueryRow(context.Background(), `SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty' AND status = 'done'`).Scan(&n)
	return n
}

// freshChecker writes to its posts and reads them back fresh.
type freshChecker struct {
	db   *pgxpool.Pool
	base string
	// checked counts the reads found exact; retried the answers asked
	// again (503, 504, no answer); dirty the answers that said dirty;
	// refused the 422s of the max counter.
	checked, retried, dirty, refused atomic.Int64
	// wrong holds the first answers that were not exact.
	mu    sync.Mutex
	wrong []string
}

// loop checks post until ctx ends.
func (c *freshChecker) loop(ctx context.Context, post int64) {
	rng := rand.New(rand.NewPCG(uint64(post), uint64(time.Now().UnixNano())))
	for i := 0; ctx.Err() == nil; i++ {
		if err := c.once(ctx, post, rng, i%10 == 0); err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.wrong = append(c.wrong, err.Error())
			c.mu.Unlock()
			return
		}
	}
}

// once writes one change to post, takes the WAL position after its commit
// and the truth on the same connection, and reads the post with that
// min_lsn until an answer is exact or wrong (returned). A write or a
// query that fails (a server failing over) ends the attempt: the next
// one reads the truth again. With extremum, it also reads the max counter,
// which must be refused.
func (c *freshChecker) once(ctx context.Context, post int64, rng *rand.Rand, extremum bool) error {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return c.pause(ctx)
	}
	if rng.IntN(3) == 0 {
		_, err = conn.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post)
	} else {
		_, err = conn.Exec(ctx, "INSERT INTO likes (post_id, w) VALUES ($1, $2)", post, fmt.Sprintf("%d.%02d", rng.IntN(100), rng.IntN(100)))
	}
	var lsn, count, sum string
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, count(*)::text, coalesce(sum(w), 0)::numeric(12,2)::text
FROM likes WHERE post_id = $1`, post).Scan(&lsn, &count, &sum)
	}
	conn.Release()
	if err != nil {
		return c.pause(ctx)
	}
	// Every other write, the count is read with the other checkers'
	// posts, all at one LSN (?keys=).
	many := rng.IntN(2) == 0
	for _, want := range []struct{ counter, value string }{{"post_likes", count}, {"post_score", sum}} {
		if err := c.readExact(ctx, want.counter, post, lsn, want.value, many && want.counter == "post_likes"); err != nil {
			return err
		}
	}
	if extremum {
		code, a, err := c.get(ctx, fmt.Sprintf("/v1/counters/post_top/%d?min_lsn=%s", post, lsn))
		if err == nil && code != http.StatusUnprocessableEntity {
			return fmt.Errorf("the max counter answered %d %+v, want 422", code, a)
		}
		if err == nil {
			c.refused.Add(1)
		}
	}
	c.checked.Add(1)
	return nil
}

// readExact reads counter's post with min_lsn lsn until it answers, and
// fails unless the answer not marked dirty is want at an LSN past lsn;
// with many, it reads the checkers' four posts in one request.
func (c *freshChecker) readExact(ctx context.Context, counter string, post int64, lsn, want string, many bool) error {
	url := fmt.Sprintf("/v1/counters/%s/%d?min_lsn=%s&timeout=5s", counter, post, lsn)
	key := fmt.Sprint(post)
	if many {
		url = fmt.Sprintf("/v1/counters/%s?keys=101,102,103,104&min_lsn=%s&timeout=5s", counter, lsn)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for ctx.Err() == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no exact answer within 3 minutes", url)
		}
		code, a, err := c.get(ctx, url)
		value, dirty := a.Value, string(a.Dirty) == "true"
		if many {
			value = a.Values[key]
			var keys []string
			_ = json.Unmarshal(a.Dirty, &keys)
			dirty = slices.Contains(keys, key)
		}
		switch {
		case err != nil || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
			c.retried.Add(1)
			_ = c.pause(ctx)
			continue
		case code != http.StatusOK:
			return fmt.Errorf("%s: status %d: %s", url, code, a.Error)
		case dirty:
			// Not vouched for while a repair runs: ask again.
			c.dirty.Add(1)
			_ = c.pause(ctx)
			continue
		case string(value) != want:
			return fmt.Errorf("%s: post %d's value %s (column %s + pending %s at %s), want %s", url, post, value, a.Column, a.Pending, a.LSN, want)
		case lsnBelow(a.LSN, lsn):
			return fmt.Errorf("%s: answered at lsn %s, below min_lsn", url, a.LSN)
		}
		return nil
	}
	return nil
}

// lsnBelow says whether the answer's LSN a is below min (or unreadable).
func lsnBelow(a, min string) bool {
	x, err := pglogrepl.ParseLSN(a)
	y, err2 := pglogrepl.ParseLSN(min)
	return err != nil || err2 != nil || x < y
}

// pause waits a little before the next attempt; it returns nil.
func (c *freshChecker) pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Millisecond):
	}
	return nil
}

// freshAnswer is a GET /v1/counters/{counter}/{key} answer, or one of
// /v1/counters/{counter}?keys= (Values, and Dirty a list of keys).
type freshAnswer struct {
	Value   json.RawMessage            `json:"value"`
	Column  json.RawMessage            `json:"column"`
	Pending json.RawMessage            `json:"pending"`
	Values  map[string]json.RawMessage `json:"values"`
	LSN     string                     `json:"lsn"`
	Dirty   json.RawMessage            `json:"dirty"`
	Error   string                     `json:"error"`
}

// get reads path; err is a request that got no answer.
func (c *freshChecker) get(ctx context.Context, path string) (int, freshAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return 0, freshAnswer{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, freshAnswer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, freshAnswer{}, err
	}
	var a freshAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return resp.StatusCode, a, fmt.Errorf("status %d, body %q: %w", resp.StatusCode, body, err)
	}
	return resp.StatusCode, a, nil
}

// waitChecked waits until n more reads were checked, and fails the test
// at once when one was wrong.
func (c *freshChecker) waitChecked(t *testing.T, n int64, what string) {
	t.Helper()
	from := c.checked.Load()
	ok := wait.Until(2*time.Minute, 20*time.Millisecond, func() bool {
		c.mu.Lock()
		bad := len(c.wrong) > 0
		c.mu.Unlock()
		return bad || c.checked.Load() >= from+n
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.wrong {
		t.Fatalf("fresh read %s: %s", what, w)
	}
	if !ok {
		t.Fatalf("%d reads checked %s in 2 minutes, want %d", c.checked.Load()-from, what, n)
	}
}

// report logs what the checkers did and fails on a wrong answer.
func (c *freshChecker) report(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.wrong {
		t.Errorf("fresh read: %s", w)
	}
	t.Logf("%d writes read back exact (count and sum), %d answers asked again (503, 504, none), %d dirty answers asked again, %d 422s of the max counter",
		c.checked.Load(), c.retried.Load(), c.dirty.Load(), c.refused.Load())
}

// reconcile drifts two of the workload's posts, asks for a reconciliation
// with POST /v1/reconcile and waits for it to end: its corrections travel
// through the stream while the checkers read.
func (c *freshChecker) reconcile(t *testing.T, e *env, d *running) {
	t.Helper()
	e.exec("UPDATE posts SET likes_count = likes_count + 3 WHERE id IN (45, 46)")
	var id int64
	wait.For(t, 2*time.Minute, "a reconciliation started", func() bool {
		resp, err := http.Post(c.base+"/v1/reconcile", "application/json", bytes.NewReader([]byte(`{}`)))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var run struct {
			ID int64 `json:"id"`
		}
		if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&run) != nil {
			return false
		}
		id = run.ID
		return true
	})
	if last := waitRun(t, d, id); last.Corrected == 0 {
		t.Logf("reconciliation %d corrected nothing: %+v", id, last)
	}
}
