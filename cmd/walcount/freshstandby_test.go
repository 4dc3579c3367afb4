package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// TestFreshReadsFromTheStandby runs an HA pair of the real binary (two
// `walcount run` of one slot, database and Redis) and reads from the
// standby daemon: checkers write likes (with a numeric weight) to posts
// only they touch and after every commit read the post from the standby
// with min_lsn = the WAL position after it, and require value = COUNT(*)
// and the sum, while three clients churn other posts. The standby answers
// (no redirect), and once the load stops both daemons give the same
// answer, at the same LSN: the active daemon's. The active daemon is then
// killed (SIGKILL); the checkers go on reading from the daemon that takes
// the slot over, and then from the killed one started again, a standby
// in its turn. Every answer must be exact; 503, 504 or no answer is asked
// again.
func TestFreshReadsFromTheStandby(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{
		PostsColumns: "score numeric(12,2) NOT NULL DEFAULT 0", LikesColumns: "w numeric(10,2) NOT NULL DEFAULT 0", Index: true, Posts: 20})+`
INSERT INTO posts (id) SELECT g FROM generate_series(101, 104) g;`)
	path := c.writeConfig(`
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_score, source: likes, key: post_id, target: posts, target_key: id, column: score, sum: w}
`)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	addrA, addrB := unusedAddr(t), unusedAddr(t)
	a := startWalcount(t, env, "run", "--http-addr", addrA)
	waitStreaming(t, a, addrA)
	b := startWalcount(t, env, "run", "--http-addr", addrB)
	waitStatus(t, addrB, `"waiting_for_slot": true`)
	pool, err := pgxpool.New(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// The checkers read from target.
	var target atomic.Value
	target.Store(addrB)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var checked, retried atomic.Int64
	var wg sync.WaitGroup
	var wrong sync.Map
	var wrongs atomic.Int64
	failed := func() bool {
		if wrongs.Load() == 0 {
			return false
		}
		wrong.Range(func(k, _ any) bool { t.Errorf("fresh read: %v", k); return true })
		return true
	}
	startCheckers := func() {
		for i := range 4 {
			post := 101 + i
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(post), uint64(time.Now().UnixNano())))
				for ctx.Err() == nil {
					if err := checkFreshRead(ctx, pool, target.Load().(string), post, rng, &retried); err != nil && ctx.Err() == nil {
						wrong.Store(err.Error(), true)
						wrongs.Add(1)
						return
					}
					checked.Add(1)
				}
			})
		}
	}
	churn, stopChurn := context.WithCancel(ctx)
	var churners sync.WaitGroup
	for w := range 3 {
		churners.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for churn.Err() == nil {
				post := 1 + rng.Int64N(20)
				_, _ = pool.Exec(churn, "INSERT INTO likes (post_id, w) VALUES ($1, $2)", post, rng.IntN(1000))
				_, _ = pool.Exec(churn, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", 1+rng.Int64N(20))
			}
		})
	}
	// readsFrom waits for n more reads checked from the daemon at addr,
	// which is a standby before and after them when standby is set.
	readsFrom := func(addr string, n int64, standby bool, what string) {
		t.Helper()
		if standby {
			waitStatus(t, addr, `"waiting_for_slot": true`)
		}
		target.Store(addr)
		from := checked.Load()
		wait.For(t, 2*time.Minute, fmt.Sprintf("%d reads checked from %s", n, what), func() bool {
			return checked.Load() >= from+n || wrongs.Load() > 0
		})
		if failed() {
			t.FailNow()
		}
		if standby {
			raw, err := fetchDaemonStatus(context.Background(), addr)
			if err != nil || !strings.Contains(string(raw), `"waiting_for_slot": true`) {
				t.Logf("the daemon at %s was no longer a standby after the reads from it (the other's session failed on a busy machine?): %v %s", addr, err, raw)
			}
		}
		t.Logf("%d reads checked from %s (%d asked again so far)", checked.Load()-from, what, retried.Load())
	}

	startCheckers()
	readsFrom(addrB, 200, true, "the standby")

	// Quiet: both daemons answer the same, at the same LSN.
	stopChurn()
	churners.Wait()
	stop()
	wg.Wait()
	sameAnswers(t, pool, addrA, addrB)

	ctx, stop = context.WithCancel(context.Background())
	defer stop()
	churn, stopChurn = context.WithCancel(ctx)
	for w := range 3 {
		churners.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w+10), uint64(time.Now().UnixNano())))
			for churn.Err() == nil {
				_, _ = pool.Exec(churn, "INSERT INTO likes (post_id, w) VALUES ($1, $2)", 1+rng.Int64N(20), rng.IntN(1000))
			}
		})
	}
	startCheckers()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	t.Log("the active daemon killed with SIGKILL")
	readsFrom(addrB, 100, false, "the daemon that took the slot over")
	waitStreaming(t, b, addrB)
	again := startWalcount(t, env, "run", "--http-addr", addrA)
	readsFrom(addrA, 100, true, "the killed daemon started again, a standby")

	stopChurn()
	churners.Wait()
	stop()
	wg.Wait()
	if failed() {
		t.FailNow()
	}
	sameAnswers(t, pool, addrA, addrB)
	t.Logf("%d fresh reads checked against COUNT(*) and SUM(), %d asked again", checked.Load(), retried.Load())
	c.settlesExact(`SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)`, "posts")
	for _, p := range []*proc{again, b} {
		if code := p.stop(); code != exitOK {
			t.Errorf("run exit %d", code)
		}
	}
}

// sameAnswers reads the checkers' posts and a churned one, with min_lsn =
// the WAL position now, from the daemons at a and b once no write is
// running, and requires the same answers, at the same LSN, and the
// values the table holds.
func sameAnswers(t *testing.T, pool *pgxpool.Pool, a, b string) {
	t.Helper()
	ctx := context.Background()
	var lsn string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	for _, post := range []int{1, 101, 102, 103, 104} {
		var count string
		if err := pool.QueryRow(ctx, "SELECT count(*)::text FROM likes WHERE post_id = $1", post).Scan(&count); err != nil {
			t.Fatal(err)
		}
		var answers [2]freshAnswer
		min := lsn
		// Something may commit between the two reads (a heartbeat, a
		// flush): then both are read again, past what either saw.
		for range 5 {
			for i, addr := range []string{a, b} {
				path := fmt.Sprintf("/v1/counters/post_likes/%d?min_lsn=%s&timeout=10s", post, min)
				wait.For(t, time.Minute, "an answer from "+addr, func() bool {
					code, got, err := freshGet(ctx, addr, path, "")
					answers[i] = got
					return err == nil && code == http.StatusOK
				})
			}
			if answers[0].LSN == answers[1].LSN {
				break
			}
			min = answers[0].LSN
			if lsnOf(answers[1].LSN) > lsnOf(min) {
				min = answers[1].LSN
			}
		}
		x, y := answers[0], answers[1]
		// The same value at the same lsn: how it splits into column and
		// pending may differ, since a flush between the two reads moves
		// deltas from pending into the column without moving lsn (the
		// position read through), as a loaded run saw (column 42 +
		// pending -1, then 41 + 0, both 41 at one lsn).
		if x.LSN != y.LSN || string(x.Value) != string(y.Value) {
			t.Errorf("post %d: %s answers %s (column %s + pending %s) at %s, %s answers %s (column %s + pending %s) at %s",
				post, a, x.Value, x.Column, x.Pending, x.LSN, b, y.Value, y.Column, y.Pending, y.LSN)
		}
		if string(answers[1].Value) != count {
			t.Errorf("post %d: both answer %s, COUNT(*) is %s", post, answers[1].Value, count)
		}
	}
}
