package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/appschema"
)

// spillPosts posts, liked by one transaction, with a budget of
// spillBudget keys per source transaction: the transaction is written to
// Redis in about spillPosts/spillBudget parts before its COMMIT.
const (
	spillPosts  = 8000
	spillBudget = 500
)

var spillSchema = appschema.SQL(appschema.Options{LikesColumns: likedBy, Posts: spillPosts})

func spillEnv(t *testing.T) *env {
	return newEnvWith(t, spillSchema, func(e *env) { e.cfg.AggregatorTransactionKeys = spillBudget })
}

// TestBigTransactionSpillsAndCrashes is issue 26's memory bound: the
// aggregator held one source transaction's map until its COMMIT (about
// 500 bytes a key: 1 GiB for 2M keys). With aggregator_transaction_keys
// it writes the transaction to Redis in parts as it streams. walcount
// crashes between two parts, before the COMMIT: the parts are in Redis
// (meta.part set, nothing handed over, nothing counted), and a new
// walcount discards them and replays the transaction, which ends exact,
// again written in parts (at most the budget held at a time). A big
// transaction that rolled back before it leaves nothing.
func TestBigTransactionSpillsAndCrashes(t *testing.T) {
	t.Parallel()
	e := spillEnv(t)
	ctx := context.Background()
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", spillPosts)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, fmt.Sprintf("INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", spillPosts)); err != nil {
		t.Fatal(err)
	}
	fp := &failpoint.Set{}
	var spills atomic.Int32
	var atCrash atomic.Value
	fp.Arm(failpoint.AfterSpill, func() error {
		if spills.Add(1) != 5 {
			return nil
		}
		m, err := buffer.New(e.rdb(), e.cfg.Slot).Meta(context.Background())
		atCrash.Store(fmt.Sprintf("part=%q err=%v", m.Part, err))
		return fmt.Errorf("%w between two parts", failpoint.ErrCrash)
	})
	d := e.start(func(o *Options) { o.Failpoints = fp })
	if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	got, _ := atCrash.Load().(string)
	t.Logf("at the crash: %s", got)
	if got == "" || got[:len(`part=""`)] == `part=""` {
		t.Fatalf("at the crash after 5 parts: %s; want a write in parts under way", got)
	}
	var sum int64
	if err := e.db.QueryRow(ctx, "SELECT coalesce(sum(likes_count), 0) FROM posts").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != 0 {
		t.Errorf("%d likes counted before the transaction's COMMIT reached walcount, want 0", sum)
	}
	fp2 := &failpoint.Set{}
	var spills2 atomic.Int32
	fp2.Arm(failpoint.AfterSpill, func() error { spills2.Add(1); return nil })
	d2 := e.start(func(o *Options) { o.Failpoints = fp2 })
	e.waitApplied(spillPosts)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d2.stop(t); err != nil {
		t.Fatal(err)
	}
	// A spill writes the budget's keys: the transaction, replayed whole,
	// was held at most spillBudget keys at a time.
	if n := spills2.Load(); n < spillPosts/spillBudget-1 {
		t.Errorf("the replayed transaction was written in %d parts before its COMMIT, want at least %d", n, spillPosts/spillBudget-1)
	}
}

// TestSpilledTransactionTruncatesSource: a transaction written in parts
// that then truncates its source erases deltas already in Redis; walcount
// replays it and holds it whole, and it ends exact.
func TestSpilledTransactionTruncatesSource(t *testing.T) {
	t.Parallel()
	e := spillEnv(t)
	d := e.start()
	e.inTransaction(
		fmt.Sprintf("INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", spillPosts),
		"TRUNCATE likes",
		"INSERT INTO likes (post_id) SELECT g FROM generate_series(1, 300) g",
	)
	e.waitApplied(300)
	e.moreLikesThenExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestSpilledTransactionDeletesTarget: a transaction written in parts
// that then deletes a post and inserts it again: the delete's move runs,
// at the COMMIT, on the parts written before it (the old row's likes go
// with it), and the new row's likes after it count.
func TestSpilledTransactionDeletesTarget(t *testing.T) {
	t.Parallel()
	e := spillEnv(t)
	d := e.start()
	e.inTransaction(
		fmt.Sprintf("INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", spillPosts),
		"DELETE FROM likes WHERE post_id = 5",
		"DELETE FROM posts WHERE id = 5",
		"INSERT INTO posts (id) VALUES (5)",
		"INSERT INTO likes (post_id) VALUES (5), (5)",
	)
	e.waitApplied(spillPosts + 1)
	e.moreLikesThenExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
