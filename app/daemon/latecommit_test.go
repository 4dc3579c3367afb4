package daemon

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/state"
)

// TestRepairOfAKeyWhoseCommitShowsLate repairs a drifted post while a like
// of it is committed in the WAL, and so in the stream and in the column,
// but not visible yet: a commit waiting for a synchronous standby (one
// named that never connects) stays in the server's running transactions
// after its commit record, as any commit does for a moment on a busy
// server (the window the failover's repair met under load on PostgreSQL
// 14, issue 37 §3). The repair's first measurement sees the like in the
// column and not in COUNT(*); the like shows before the second. The
// measurements disagree, and the key is measured again until two agree:
// before, the key was dropped, the run ended done and deleted the mark,
// and the post stayed off by its whole drift (likes_count 16, COUNT(*) 11).
func TestRepairOfAKeyWhoseCommitShowsLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	fp := &failpoint.Set{}
	d := e.start(func(o *Options) { o.Failpoints = fp })
	waitRun(t, d, 0) // the first start's backfill
	for range 10 {
		e.exec("INSERT INTO likes (post_id) VALUES (1)")
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()

	// A commit that asks for synchronous replication waits for a standby
	// that never comes, committed locally; walcount's own commit locally.
	for _, q := range []string{
		"ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
		"ALTER SYSTEM SET synchronous_commit = 'local'",
		"SELECT pg_reload_conf()",
	} {
		e.exec(q)
	}
	waitFor(t, "the settings reloaded", func() bool {
		var v string
		return e.db.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&v) == nil && v == "nobody"
	})
	// The drift to repair: post 1's column counts 5 likes too many.
	e.exec("UPDATE posts SET likes_count = likes_count + 5 WHERE id = 1")

	late, err := pgx.Connect(ctx, e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close(ctx)
	var latePID int
	if err := late.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&latePID); err != nil {
		t.Fatal(err)
	}
	release := func() { _, _ = e.db.Exec(ctx, "SELECT pg_cancel_backend($1)", latePID) }
	var wg sync.WaitGroup
	defer wg.Wait()
	defer release() // a failed test leaves no commit waiting
	wg.Go(func() {
		// Returns once its wait is cancelled, with a warning: committed.
		_, _ = late.Exec(ctx, "SET synchronous_commit = on; INSERT INTO likes (post_id) VALUES (1)")
	})
	count := func() (cached, truth int64) {
		_ = e.db.QueryRow(ctx, "SELECT likes_count, (SELECT count(*) FROM likes WHERE post_id = 1) FROM posts WHERE id = 1").Scan(&cached, &truth)
		return cached, truth
	}
	waitFor(t, "walcount to count the like that is not visible yet", func() bool {
		cached, truth := count()
		return cached == 16 && truth == 10
	})

	// The like shows between the repair's first and second measurements.
	var measured atomic.Int32
	fp.Arm(failpoint.AfterMeasure, func() error {
		// The reconciler's goroutine: no t.Fatal here.
		if measured.Add(1) == 1 {
			release()
			if !wait.Until(catchUp, 10*time.Millisecond, func() bool { _, truth := count(); return truth == 11 }) {
				t.Error("the late like did not show once its wait was cancelled")
			}
		}
		return nil
	})
	if err := state.MarkDirty(ctx, e.db, e.cfg.Slot, "post_likes", []string{"1"}, "the test's drift"); err != nil {
		t.Fatal(err)
	}
	e.waitClean(t, 2*time.Minute)
	if measured.Load() < 3 {
		t.Errorf("the repair measured post 1 %d times; its first two measurements disagree, so it takes three", measured.Load())
	}
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
