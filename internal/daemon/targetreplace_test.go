package daemon

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/walcount/walcount/state"
)

// The target table emptied or replaced (design rule 17): its rows after a
// TRUNCATE are new, and rows inserted with a counter value already in
// them (a restore) count likes that walcount then adds again. Both leave
// the counter dirty, and reconciliation makes it exact.

// TestTargetRestored is a data-only restore while walcount runs: posts and
// likes saved, both truncated, posts restored with their counts, then the
// likes. Before walcount followed it, every counter ended doubled.
func TestTargetRestored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 150)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	e.exec("CREATE TABLE posts_dump AS SELECT * FROM posts")
	e.exec("CREATE TABLE likes_dump AS SELECT * FROM likes")
	e.exec("TRUNCATE posts, likes")
	// A restore takes a while: walcount has passed the TRUNCATE before
	// the rows come back.
	e.waitCaughtUp(catchUp)
	e.exec("INSERT INTO posts SELECT * FROM posts_dump")
	e.exec("INSERT INTO likes SELECT * FROM likes_dump")
	e.waitRepaired(t)
	e.assertExact()
	e.moreLikesThenExact()
	e.assertHealthy(r)
}

// TestTargetTruncatedAndRefilled truncates the target with its likes and
// fills both again in the same transaction, several times, while likes
// stream in and a flush waits on a post an app transaction holds.
func TestTargetTruncatedAndRefilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			newWorkload(e.db).run(ctx, 2, 20)
		}
	})
	for range 3 {
		// An app transaction holds post 5 while likes of it wait in a
		// flush; the refill commits after it lets go.
		holder, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Exec(ctx, "SELECT 1 FROM posts WHERE id = 5 FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		e.exec("INSERT INTO likes (post_id) SELECT 5 FROM generate_series(1, 10)")
		time.Sleep(3 * e.cfg.FlushInterval)
		refilled := make(chan struct{})
		go func() {
			defer close(refilled)
			tx, err := e.db.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			commitAll(t, tx,
				"TRUNCATE posts, likes",
				"INSERT INTO posts (id) SELECT g FROM generate_series(1, 50) g",
				"INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 200) g",
			)
		}()
		time.Sleep(3 * e.cfg.FlushInterval)
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		<-refilled
	}
	close(stop)
	wg.Wait()
	e.waitRepaired(t)
	e.assertExact()
	e.moreLikesThenExact()
	e.assertHealthy(r)
}

// waitRepaired waits until W passed everything committed and no dirty
// mark is left (a dirty mark is durable before W passes the transaction
// that caused it), then until W passed the repair's corrections.
func (e *env) waitRepaired(t testing.TB) {
	t.Helper()
	e.waitCaughtUp(catchUp)
	waitFor(t, "no dirty mark left", func() bool {
		marks, err := state.ListDirty(context.Background(), e.db, e.cfg.Slot)
		return err == nil && len(marks) == 0
	})
	e.waitCaughtUp(catchUp)
}
