package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// Posts batchFirst to batchLast are the batch checker's, liked many at a
// time. Post batchNil is liked first in every batch transaction and
// unliked last: its count is 0 at every LSN, though the transaction's
// parts in Redis hold its like until the last part.
const batchFirst, batchLast, batchNil = 1001, 1600, 1700

// TestFreshReadsExactThroughPiecesPartsAndLocks reads back, with
// min_lsn, writes that go through the flush's and the stream's bigger
// paths (docs/design.md §7 (b), (d)): a batch checker likes and unlikes
// hundreds of its own posts in one transaction, which the stream writes
// to Redis in parts (aggregator_transaction_keys 100: meta.part) and the
// flush applies in pieces (100 keys a transaction: walcount.carried
// between them), while an admin transaction holds one of its posts'
// row at a time, so the flush defers that key (carried), and the
// single-key checkers and the workload go on. Each batch is read with
// ?keys= (all its posts at one LSN) and every post's count and sum must
// be its COUNT(*) and SUM(). A post liked first and unliked last in each
// batch transaction is read all along with no min_lsn: its count must be
// 0 at every LSN, while the transaction's parts hold its like.
func TestFreshReadsExactThroughPiecesPartsAndLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvWith(t, freshFaultSchema+fmt.Sprintf("\nINSERT INTO posts (id) SELECT g FROM generate_series(%d, %d) g;\nINSERT INTO posts (id) VALUES (%d);", batchFirst, batchLast, batchNil),
		func(e *env) {
			e.cfg = e.loadConfig(testSettings + freshFaultCounters)
			e.cfg.AggregatorTransactionKeys = 100
		})
	fp := &failpoint.Set{}
	var parts atomic.Int64
	fp.Arm(failpoint.AfterSpill, func() error { parts.Add(1); return nil })
	d := e.start(func(o *Options) {
		o.Failpoints = fp
		o.FlushChunk, o.FlushTransactionKeys, o.FlushTransactionTime = 50, 100, time.Hour
	})
	waitRun(t, d, 0) // the first start's backfill
	ck := &freshChecker{db: e.db, base: serveFresh(t, d)}

	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range 4 {
		wg.Go(func() { ck.loop(cctx, int64(101+i)) })
	}
	var batches, sawCarried atomic.Int64
	var batchErr atomic.Value
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
		for cctx.Err() == nil {
			if err := ck.batch(cctx, rng); err != nil {
				if cctx.Err() == nil {
					batchErr.Store(err)
				}
				return
			}
			batches.Add(1)
		}
	})
	wg.Go(func() {
		// An admin edit holds one batch post's row at a time for a
		// while: the flush defers its key, carried past W.
		for cctx.Err() == nil {
			post := batchFirst + rand.IntN(batchLast-batchFirst+1)
			tx, err := e.db.Begin(cctx)
			if err != nil {
				continue
			}
			if _, err := tx.Exec(cctx, "SELECT 1 FROM posts WHERE id = $1 FOR UPDATE", post); err == nil {
				held := time.Now().Add(500 * time.Millisecond)
				_ = wait.Until(time.Until(held), 50*time.Millisecond, func() bool {
					var n int
					if e.db.QueryRow(cctx, "SELECT count(*) FROM walcount.carried WHERE key = $1", fmt.Sprint(post)).Scan(&n) == nil && n > 0 {
						sawCarried.Add(1)
						return true
					}
					return false
				})
				// Held on a little after its key is carried, so that reads
				// find it there.
				select {
				case <-cctx.Done():
				case <-time.After(time.Until(held)):
				}
			}
			_ = tx.Rollback(context.Background())
		}
	})
	var nilReads atomic.Int64
	wg.Go(func() {
		// Post batchNil, read with no min_lsn at whatever LSN: always 0.
		for cctx.Err() == nil {
			code, a, err := ck.get(cctx, fmt.Sprintf("/v1/counters/post_likes/%d?timeout=5s", batchNil))
			if err != nil || code != http.StatusOK {
				_ = ck.pause(cctx)
				continue
			}
			if string(a.Value) != "0" {
				ck.mu.Lock()
				ck.wrong = append(ck.wrong, fmt.Sprintf("post %d, liked and unliked in each batch transaction: value %s (column %s + pending %s) at %s, want 0",
					batchNil, a.Value, a.Column, a.Pending, a.LSN))
				ck.mu.Unlock()
				return
			}
			nilReads.Add(1)
		}
	})
	w := newWorkload(e.db)
	stopLoad := w.background(2, 20)
	defer stopLoad()

	wait.For(t, 3*time.Minute, "30 batches and 300 single writes read back", func() bool {
		return (batches.Load() >= 30 && ck.checked.Load() >= 300) || batchErr.Load() != nil || ck.failed()
	})
	stop()
	wg.Wait()
	stopLoad()
	if err, _ := batchErr.Load().(error); err != nil {
		t.Errorf("batch: %v", err)
	}
	ck.report(t)
	pieces := counterValue(d.d.m.FlushPieces)
	t.Logf("%d batches of up to %d posts read back exact, %d parts written before a COMMIT, %d flush pieces, %d held keys seen carried, post %d read %d times at 0",
		batches.Load(), batchLast-batchFirst+1, parts.Load(), pieces, sawCarried.Load(), batchNil, nilReads.Load())
	if parts.Load() == 0 || pieces == 0 || sawCarried.Load() == 0 {
		t.Errorf("the paths under test were not taken: %d parts, %d pieces, %d keys seen carried", parts.Load(), pieces, sawCarried.Load())
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// failed says whether a checker found a wrong answer.
func (c *freshChecker) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.wrong) > 0
}

// batch likes about half of the batch posts and unlikes about a tenth of
// their likes in one transaction (which likes post batchNil first and
// unlikes it last), takes the WAL position after its commit
// and every post's COUNT(*) and SUM() on the same connection, and reads
// all of them with ?keys= and that min_lsn until an answer is exact or
// wrong (returned). A failed write ends the attempt (nil).
func (c *freshChecker) batch(ctx context.Context, rng *rand.Rand) error {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return nil
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil
	}
	var nilLike int64
	err = tx.QueryRow(ctx, "INSERT INTO likes (post_id, w) VALUES ($1, 1) RETURNING id", batchNil).Scan(&nilLike)
	if err == nil {
		_, err = tx.Exec(ctx, `WITH gone AS (DELETE FROM likes WHERE post_id BETWEEN $1 AND $2 AND random() < 0.1)
INSERT INTO likes (post_id, w) SELECT g, (random() * 100)::numeric(10,2) FROM generate_series($1::bigint, $2::bigint) g WHERE random() < $3`,
			batchFirst, batchLast, 0.3+0.4*rng.Float64())
	}
	if err == nil {
		_, err = tx.Exec(ctx, "DELETE FROM likes WHERE id = $1", nilLike)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil
	}
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return nil
	}
	rows, err := conn.Query(ctx, `SELECT p.id::text, count(l.id)::text, coalesce(sum(l.w), 0)::numeric(12,2)::text
FROM posts p LEFT JOIN likes l ON l.post_id = p.id WHERE p.id BETWEEN $1 AND $2 GROUP BY p.id`, batchFirst, batchLast)
	if err != nil {
		return nil
	}
	counts, sums := map[string]string{}, map[string]string{}
	for rows.Next() {
		var id, n, s string
		if err := rows.Scan(&id, &n, &s); err != nil {
			rows.Close()
			return nil
		}
		counts[id], sums[id] = n, s
	}
	rows.Close()
	if rows.Err() != nil {
		return nil
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	for _, want := range []struct {
		counter string
		values  map[string]string
	}{{"post_likes", counts}, {"post_score", sums}} {
		url := fmt.Sprintf("/v1/counters/%s?keys=%s&min_lsn=%s&timeout=5s", want.counter, strings.Join(keys, ","), lsn)
		if err := c.readBatch(ctx, url, lsn, want.values); err != nil {
			return err
		}
	}
	return nil
}

// readBatch reads url until an answer is exact (nil) or wrong.
func (c *freshChecker) readBatch(ctx context.Context, url, lsn string, want map[string]string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for ctx.Err() == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no exact answer within 3 minutes", url[:60])
		}
		code, a, err := c.get(ctx, url)
		var dirty []string
		_ = json.Unmarshal(a.Dirty, &dirty)
		switch {
		case err != nil || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
			c.retried.Add(1)
			_ = c.pause(ctx)
			continue
		case code != http.StatusOK:
			return fmt.Errorf("?keys= read: status %d: %s", code, a.Error)
		case len(dirty) > 0:
			c.dirty.Add(1)
			_ = c.pause(ctx)
			continue
		case lsnBelow(a.LSN, lsn):
			return fmt.Errorf("?keys= read: answered at lsn %s, below min_lsn %s", a.LSN, lsn)
		}
		var off []string
		for k, v := range want {
			if got := string(a.Values[k]); got != v {
				off = append(off, fmt.Sprintf("%s: %s, want %s", k, got, v))
			}
		}
		if len(off) > 0 {
			return fmt.Errorf("?keys= read of %d posts at %s (min_lsn %s): %d off: %v", len(want), a.LSN, lsn, len(off), off)
		}
		return nil
	}
	return nil
}
