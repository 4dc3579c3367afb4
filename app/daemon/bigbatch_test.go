package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// bigBatchPosts is the size of the scaled-down bulk insert of issue 26
// (2,000,000 posts there): enough keys for many pieces of the small
// bounds the tests set.
const bigBatchPosts = 50000

// bigBatchSchema is schema with bigBatchPosts posts.
var bigBatchSchema = appschema.SQL(appschema.Options{LikesColumns: likedBy, Posts: bigBatchPosts})

// smallPieces bounds a flush transaction at 4,000 keys in statements of
// 1,000, and never by time, so that the pieces are the same on any machine.
func smallPieces(o *Options) {
	o.FlushChunk, o.FlushTransactionKeys, o.FlushTransactionTime = 1000, 4000, time.Hour
}

// bulkInsert is the application's one statement that likes every post.
func (e *env) bulkInsert() {
	e.t.Helper()
	if _, err := e.db.Exec(context.Background(), fmt.Sprintf(
		"INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", bigBatchPosts)); err != nil {
		e.t.Fatal(err)
	}
}

// waitApplied waits until the columns count likes likes and nothing is
// carried any more: the pieces of the batch staged at W are all committed. A busy machine makes them slow, so
// the bound is generous.
func (e *env) waitApplied(likes int64) {
	e.t.Helper()
	var n, sum int64
	var err error
	if !wait.Until(3*time.Minute, 100*time.Millisecond, func() bool {
		err = e.db.QueryRow(context.Background(),
			"SELECT (SELECT count(*) FROM walcount.carried), (SELECT coalesce(sum(likes_count), 0) FROM posts)").Scan(&n, &sum)
		return err == nil && n == 0 && sum == likes
	}) {
		e.t.Fatalf("after 3 minutes: %d keys carried, %d of %d likes counted (%v)", n, sum, likes, err)
	}
}

// rowsPerWriter returns how many posts each transaction last wrote
// (grouped by xmin), the largest group first.
func (e *env) rowsPerWriter() []int64 {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(),
		"SELECT count(*) FROM posts WHERE likes_count <> 0 GROUP BY xmin::text ORDER BY 1 DESC")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// TestBigBatchFlushesInPieces is issue 26's bulk insert, scaled down: one
// statement likes every post. The batch is flushed in several short
// transactions, none of which updates more rows than its bound, and
// between two of them the rows already written are free for the app
// while the rest of the batch is still to come (before: one transaction
// updated every post and held all their locks until its commit).
func TestBigBatchFlushesInPieces(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, bigBatchSchema, nil)
	m := metrics.New()
	fp := &failpoint.Set{}
	var between atomic.Int32
	var midway atomic.Value
	fp.Arm(failpoint.BetweenPieces, func() error {
		if between.Add(1) != 2 {
			return nil
		}
		// The flusher is between two pieces: what they wrote is
		// committed, and the rows are free.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var written int64
		if err := e.db.QueryRow(ctx, "SELECT count(*) FROM posts WHERE likes_count <> 0").Scan(&written); err != nil {
			midway.Store(err.Error())
			return nil
		}
		tx, err := e.db.Begin(ctx)
		if err != nil {
			midway.Store(err.Error())
			return nil
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		var locked int64
		err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM posts WHERE likes_count <> 0 FOR UPDATE NOWAIT) AS l`).Scan(&locked)
		midway.Store(fmt.Sprintf("written=%d locked=%d err=%v", written, locked, err))
		return nil
	})
	// Inserted before walcount starts, the batch is the first the
	// stream hands over, whole.
	e.bulkInsert()
	d := e.start(smallPieces, func(o *Options) { o.Metrics, o.Failpoints = m, fp })
	e.waitApplied(bigBatchPosts)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	groups := e.rowsPerWriter()
	t.Logf("posts per writing transaction: %v", groups)
	if len(groups) < bigBatchPosts/4000 {
		t.Errorf("the batch was written by %d transactions, want at least %d", len(groups), bigBatchPosts/4000)
	}
	if len(groups) > 0 && groups[0] > 4000 {
		t.Errorf("one transaction updated %d posts, want at most 4000", groups[0])
	}
	var pieces dto.Metric
	if err := m.FlushPieces.Write(&pieces); err != nil {
		t.Fatal(err)
	}
	if n := pieces.GetCounter().GetValue(); n < bigBatchPosts/4000 {
		t.Errorf("walcount_flush_pieces_total = %v, want at least %d", n, bigBatchPosts/4000)
	}
	got, _ := midway.Load().(string)
	var written, locked int64
	var lockErr string
	if _, err := fmt.Sscanf(got, "written=%d locked=%d err=%s", &written, &locked, &lockErr); err != nil {
		t.Fatalf("between two pieces: %q", got)
	}
	if written == 0 || written >= bigBatchPosts || locked != written || lockErr != "<nil>" {
		t.Errorf("between two pieces: %s; want some posts written, all of them free to lock", got)
	}
}

// TestBigBatchCrashBetweenPieces crashes walcount while it applies the
// bulk insert's batch: as its first transaction stages the batch, as a
// piece is about to commit, between two pieces, and after a piece's
// commit before its change events. A new walcount ends exact, every delta
// applied once, and every post's change event carries its column.
func TestBigBatchCrashBetweenPieces(t *testing.T) {
	t.Parallel()
	for _, p := range []struct {
		name string
		nth  int
	}{
		{failpoint.BeforeCommit, 1},  // the stage
		{failpoint.BeforeCommit, 3},  // the second piece
		{failpoint.BetweenPieces, 4}, // after the fourth piece
		{failpoint.BeforeEvents, 2},  // the second piece committed, its events not published
	} {
		t.Run(fmt.Sprintf("%s#%d", p.name, p.nth), func(t *testing.T) {
			t.Parallel()
			// Room for every post's change events, those published
			// again after the crash included.
			e := newEnvWith(t, bigBatchSchema, func(e *env) { e.cfg.EventsMaxLen = 1_000_000 })
			fp := &failpoint.Set{}
			disarm := fp.CrashAfter(p.name, p.nth)
			e.bulkInsert()
			d := e.start(smallPieces, func(o *Options) { o.Failpoints = fp })
			if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
				t.Fatalf("daemon returned %v, want the simulated crash", err)
			}
			disarm()
			var written int64
			if err := e.db.QueryRow(context.Background(), "SELECT count(*) FROM posts WHERE likes_count <> 0").Scan(&written); err != nil {
				t.Fatal(err)
			}
			t.Logf("posts written at the crash: %d", written)
			if _, err := e.db.Exec(context.Background(), "INSERT INTO likes (post_id) SELECT g FROM generate_series(1, 100) g"); err != nil {
				t.Fatal(err)
			}
			d2 := e.start(smallPieces)
			e.waitApplied(bigBatchPosts + 100)
			e.waitCaughtUp(catchUp)
			e.assertExact()
			e.assertEventsMatchColumns()
			if err := d2.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// slowRowPosts and slowRowSleep make every update of a post's counter
// slow, the same on any machine: a BEFORE UPDATE trigger sleeps
// slowRowSleep in each.
const (
	slowRowPosts = 3000
	slowRowSleep = 2 * time.Millisecond
)

var slowRowSchema = appschema.SQL(appschema.Options{LikesColumns: likedBy, Posts: slowRowPosts}) + fmt.Sprintf(`
CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.likes_count IS DISTINCT FROM OLD.likes_count THEN PERFORM pg_sleep(%g); END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER slow_row BEFORE UPDATE ON posts FOR EACH ROW EXECUTE FUNCTION slow_row();
`, slowRowSleep.Seconds())

// TestFlushOfSlowRowsHoldsLocksBriefly is issue 26's bound on the app's
// wait behind a flush, with rows made slow deterministically (each update
// of a counter sleeps 2 ms in a trigger). One batch of 3,000 keys, under
// every default (flush_lock_time 200ms): before, the flush updated them
// in one statement of one transaction, whose row locks the app's own
// update of a post waited for about 6 s. Now the statements are sized by
// their pace, and a flush that finds its rows slower than it knew gives
// up and applies the batch in pieces: no transaction updates more rows
// than fit in about flush_lock_time (checked by xmin, which does not
// depend on the machine's speed: every row costs at least 2 ms), and an
// app on its own connection taking each post's row lock, as its UPDATE
// would, never waits long (a generous bound). The log line of each staged
// batch gives the pace that sized its statements (per_key_seconds, issue
// 35 §2: without it a flush staged for its pace could not be told from
// one staged for its size): at least the trigger's sleep.
func TestFlushOfSlowRowsHoldsLocksBriefly(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, slowRowSchema, nil)
	if _, err := e.db.Exec(context.Background(), fmt.Sprintf(
		"INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", slowRowPosts)); err != nil {
		t.Fatal(err)
	}
	// The app: one connection taking one post's row lock after another.
	conn, err := e.db.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	stop := make(chan struct{})
	done := make(chan struct{})
	var longest time.Duration
	var locks int
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := 1 + (i*7919)%slowRowPosts
			began := time.Now()
			if _, err := conn.Exec(context.Background(), "SELECT id FROM posts WHERE id = $1 FOR NO KEY UPDATE", id); err != nil {
				t.Error(err)
				return
			}
			longest = max(longest, time.Since(began))
			locks++
		}
	}()
	core, logs := observer.New(zapcore.InfoLevel)
	d := e.start(func(o *Options) { o.Logger = zap.New(zapcore.NewTee(o.Logger.Core(), core)) })
	e.waitApplied(slowRowPosts)
	close(stop)
	<-done
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	groups := e.rowsPerWriter()
	t.Logf("posts per writing transaction: %v; the app's longest row lock wait: %s of %d", groups, longest, locks)
	// 500 ms of the trigger's sleeps: a transaction that updated more
	// rows held the first one's lock longer than the bound.
	const most = int64(500 * time.Millisecond / slowRowSleep)
	if len(groups) > 0 && groups[0] > most {
		t.Errorf("one transaction updated %d posts, %s or more of row updates; want at most %d", groups[0], time.Duration(groups[0])*slowRowSleep, most)
	}
	if longest > 2500*time.Millisecond {
		t.Errorf("the app waited %s for a post's row lock, want well under 2.5 s", longest)
	}
	staged := logs.FilterMessageSnippet("staged a big batch").All()
	if len(staged) == 0 {
		t.Fatal("no batch was staged: the flush did not go to pieces")
	}
	for _, l := range staged {
		pace, ok := l.ContextMap()["per_key_seconds"].(time.Duration)
		if !ok || pace < slowRowSleep {
			t.Errorf("a staged batch logged the pace %v (%v), want at least the trigger's %s a key", l.ContextMap()["per_key_seconds"], ok, slowRowSleep)
		}
	}
}
