package daemon

import (
	"context"
	"strings"
	"sync"
	"testing"

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
		waitFor(t, "a flush carrying post 5, held by the app", func() bool {
			return gaugeValue(r.d.m.FlushKeysDeferred) >= 1
		})
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
		waitFor(t, "the refill's TRUNCATE waiting on the app's lock", func() bool {
			var n int
			err := e.db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'TRUNCATE posts%'").Scan(&n)
			return err == nil && n > 0
		})
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

// TestSourceRenamed renames the source under load while the app writes to
// it under its new name, restarts the session meanwhile, and renames it
// back. The stream names the changes by the relation's identity, which a
// rename keeps: every change is counted. Before, 10,045 changes were
// never counted in the same run by hand.
func TestSourceRenamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	e.exec("ALTER TABLE likes RENAME TO likes_v2")
	e.exec("INSERT INTO likes_v2 (post_id) SELECT 1 + g % 50 FROM generate_series(1, 300) g")
	e.exec("DELETE FROM likes_v2 WHERE id % 7 = 0")
	e.waitCaughtUp(catchUp)
	// A new session cannot start while the name designates nothing: the
	// daemon stops, saying so, and loses nothing.
	e.exec("INSERT INTO likes_v2 (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g")
	e.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name = 'walcount'")
	if err := r.wait(t, catchUp); err == nil || !strings.Contains(err.Error(), "public") {
		t.Fatalf("a session started while the source is renamed: %v, want the daemon stopped naming the table", err)
	}
	e.exec("INSERT INTO likes_v2 (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g")
	e.exec("ALTER TABLE likes_v2 RENAME TO likes")
	r = e.start()
	e.moreLikesThenExact()
	if !r.d.keepable(e.cfg.Counters[0].Name) {
		t.Fatal("the counter is not keepable after its source was renamed back")
	}
	if marks, err := state.ListDirty(ctx, e.db, e.cfg.Slot); err != nil || len(marks) != 0 {
		t.Fatalf("dirty marks after a rename that was followed: %+v, %v", marks, err)
	}
}

// TestTargetSwapped replaces the target by a copy, renamed into its place
// as online schema-change tools do, then deletes and re-creates posts in
// the copy. The copy is not in the publication: its changes never reach
// the stream. walcount notices while running, marks the counter dirty and
// keeps it from reconciliation until walcount setup publishes the new
// table, then repairs it. Before, posts ended at -70, -18 and -51.
func TestTargetSwapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 100)
	e.waitCaughtUp(catchUp)
	e.exec("CREATE TABLE posts_new (LIKE posts INCLUDING ALL)")
	e.exec("INSERT INTO posts_new SELECT * FROM posts")
	e.inTransaction("ALTER TABLE posts RENAME TO posts_old", "ALTER TABLE posts_new RENAME TO posts")
	name := e.cfg.Counters[0].Name
	waitFor(t, "the counter kept from the stream", func() bool { return !r.d.keepable(name) })
	e.exec("DELETE FROM posts WHERE id IN (7, 8, 9)")
	e.exec("INSERT INTO posts (id) VALUES (7), (8), (9)")
	newWorkload(e.db).run(ctx, 2, 50)
	e.setup()
	e.waitRepaired(t)
	e.assertExact()
	e.moreLikesThenExact()
}
