package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/failpoint"
)

// TestApplyLagWhileABigBatchDrains: a batch too big for one transaction
// moves W in the transaction that stages it in walcount.carried, and its
// deltas reach the counter columns piece by piece after. Between two
// pieces, /status's apply lag still counts the bulk insert as pending
// (before, the staging transaction's W released it, and the lag read a
// later transaction's while most posts were still to be counted); once the
// last piece committed, it is applied.
func TestApplyLagWhileABigBatchDrains(t *testing.T) {
	t.Parallel()
	const posts = 12000 // three pieces of smallPieces' 4,000 keys
	e := newEnvWith(t, fmt.Sprintf("%s\nINSERT INTO posts (id) SELECT g FROM generate_series(51, %d) g;", schema, posts), nil)
	fp := &failpoint.Set{}
	var between atomic.Int32
	var midway atomic.Value
	var atLeast atomic.Int64
	var inserted time.Time
	var d *running
	fp.Arm(failpoint.BetweenPieces, func() error {
		if between.Add(1) != 1 {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var written int64
		if err := e.db.QueryRow(ctx, "SELECT count(*) FROM posts WHERE likes_count <> 0").Scan(&written); err != nil {
			midway.Store(err.Error())
			return nil
		}
		// The insert committed before inserted: its lag is at least this.
		least := time.Since(inserted)
		atLeast.Store(int64(least))
		lag := d.d.Status(ctx).ApplyLag
		got := fmt.Sprintf("%d of %d posts written, pending %.3fs, at least %.3fs", written, posts, lag.PendingSeconds, least.Seconds())
		if written == 0 || written >= posts || lag.PendingSeconds < least.Seconds() {
			got = "wrong: " + got
		}
		midway.Store(got)
		return nil
	})
	// Inserted before walcount starts, the batch is the first the
	// stream hands over, whole.
	e.exec(fmt.Sprintf("INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", posts))
	inserted = time.Now()
	d = e.start(smallPieces, func(o *Options) { o.Failpoints = fp })
	e.waitApplied(posts)
	got, _ := midway.Load().(string)
	t.Logf("between two pieces: %s", got)
	if got == "" || got[0] < '0' || got[0] > '9' {
		t.Fatalf("between two pieces: %q; want the bulk insert pending for at least as long as since it committed", got)
	}
	// The drain ends once it found nothing left after its last piece,
	// a moment after the columns show every like: then the bulk insert is
	// applied, and what is pending (heartbeats) is younger.
	least := time.Duration(atLeast.Load())
	poll(t, "the bulk insert applied in the apply lag", func() (bool, string) {
		lag := d.d.Status(context.Background()).ApplyLag
		return lag.PendingSeconds < least.Seconds(), fmt.Sprintf("%+v", lag)
	})
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
