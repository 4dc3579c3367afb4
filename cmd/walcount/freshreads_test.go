package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// freshAnswer is a GET /v1/counters/{counter}/{key} answer.
type freshAnswer struct {
	Counter string          `json:"counter"`
	Key     string          `json:"key"`
	Value   json.RawMessage `json:"value"`
	Column  json.RawMessage `json:"column"`
	Pending json.RawMessage `json:"pending"`
	LSN     string          `json:"lsn"`
	Dirty   bool            `json:"dirty"`
	Error   string          `json:"error"`
}

// freshGet reads a URL of the daemon at addr with the token (if any) and
// returns the status and the decoded answer; err is a request that did not
// get an answer (a daemon killed or not started yet).
func freshGet(ctx context.Context, addr, path, token string) (int, freshAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, freshAnswer{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
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

// TestFreshReadsExactThroughKill9 is issue 39's exactness test: checkers
// write likes (and a numeric score) to posts only they touch, and after
// every commit read the post with min_lsn = the WAL position after the
// commit, and require value = COUNT(*) (and the sum), while three other
// clients churn other posts and walcount is killed with SIGKILL twice.
// Every answer must be exact; an answer the daemon cannot give (killed,
// starting) is asked again, never accepted.
func TestFreshReadsExactThroughKill9(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{
		PostsColumns: "score numeric(12,2) NOT NULL DEFAULT 0", LikesColumns: "w numeric(10,2) NOT NULL", Index: true, Posts: 20})+`
ALTER TABLE likes ADD FOREIGN KEY (post_id) REFERENCES posts;
INSERT INTO posts (id) SELECT g FROM generate_series(101, 104) g;`)
	path := c.writeConfig(`
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_score, source: likes, key: post_id, target: posts, target_key: id, column: score, sum: w}
`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	pool, err := pgxpool.New(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var checked, retried atomic.Int64
	var wg sync.WaitGroup
	var wrong sync.Map
	for i := range 4 {
		post := 101 + i
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(post), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				if err := checkFreshRead(ctx, pool, addr, post, rng, &retried); err != nil && ctx.Err() == nil {
					wrong.Store(err.Error(), true)
					return
				}
				checked.Add(1)
			}
		})
	}
	last := killTwiceUnderLoad(t, env, addr, func(ctx context.Context, rng *rand.Rand) error {
		post := 1 + rng.Int64N(20)
		var err error
		switch k := rng.IntN(10); {
		case k < 5:
			_, err = pool.Exec(ctx, "INSERT INTO likes (post_id, w) VALUES ($1, $2)", post, rng.IntN(1000))
		case k < 7:
			_, err = pool.Exec(ctx, "UPDATE likes SET post_id = $2 WHERE id = (SELECT id FROM likes WHERE post_id = $1 LIMIT 1)", post, 1+rng.Int64N(20))
		default:
			_, err = pool.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post)
		}
		return err
	})
	stop()
	wg.Wait()
	wrong.Range(func(k, _ any) bool { t.Errorf("fresh read: %v", k); return true })
	n := checked.Load()
	t.Logf("%d fresh reads checked against COUNT(*) and SUM(), %d asked again while walcount was down", n, retried.Load())
	if n < 50 {
		t.Errorf("only %d fresh reads were checked", n)
	}
	if code := last.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}

// checkFreshRead writes one change to post (a like with a weight, or the
// delete of one), takes the WAL position after its commit, reads the post
// with that min_lsn until the daemon answers, and compares the answer with
// COUNT(*) and SUM() of the post, which only this checker changes.
func checkFreshRead(ctx context.Context, pool *pgxpool.Pool, addr string, post int, rng *rand.Rand, retried *atomic.Int64) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if rng.IntN(3) == 0 {
		_, err = conn.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", post)
	} else {
		_, err = conn.Exec(ctx, "INSERT INTO likes (post_id, w) VALUES ($1, $2)", post, fmt.Sprintf("%d.%02d", rng.IntN(100), rng.IntN(100)))
	}
	if err != nil {
		return err
	}
	var lsn, count, sum string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, count(*)::text, coalesce(sum(w), 0)::numeric(12,2)::text
FROM likes WHERE post_id = $1`, post).Scan(&lsn, &count, &sum)
	if err != nil {
		return err
	}
	for _, want := range []struct{ counter, value string }{{"post_likes", count}, {"post_score", sum}} {
		url := fmt.Sprintf("/v1/counters/%s/%d?min_lsn=%s&timeout=10s", want.counter, post, lsn)
		for {
			if ctx.Err() != nil {
				return nil
			}
			code, a, err := freshGet(ctx, addr, url, "")
			if err != nil || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout {
				// Killed, starting or catching up: ask again.
				retried.Add(1)
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			if code != http.StatusOK {
				return fmt.Errorf("%s: status %d: %s", url, code, a.Error)
			}
			if string(a.Value) != want.value {
				return fmt.Errorf("%s: value %s (column %s + pending %s at %s), want %s", url, a.Value, a.Column, a.Pending, a.LSN, want.value)
			}
			if lsnOf(a.LSN) < lsnOf(lsn) {
				return fmt.Errorf("%s: answered at lsn %s, below min_lsn", url, a.LSN)
			}
			break
		}
	}
	return nil
}

func lsnOf(s string) uint64 {
	var hi, lo uint64
	_, _ = fmt.Sscanf(s, "%X/%X", &hi, &lo)
	return hi<<32 | lo
}
