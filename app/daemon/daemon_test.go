package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/wait"
)

const catchUp = 60 * time.Second

func TestRandomWorkloadEndsExact(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.start()
	w := newWorkload(e.db)
	w.run(context.Background(), 6, 250)
	w.report(t)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatalf("clean stop: %v", err)
	}
	// After a clean stop the slot confirms exactly W and Redis is empty.
	ctx := context.Background()
	w0, err := e.checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var confirmed cdc.LSN
	if err := e.db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if confirmed < w0 {
		t.Errorf("slot confirmed %s, checkpoint %s: the final ack must reach W", confirmed, w0)
	}
	rdb := e.rdb()
	if n, err := buffer.New(rdb, e.cfg.Slot).Len(ctx); err != nil || n != 0 {
		t.Errorf("buffer keys after clean stop = %d, %v; want 0", n, err)
	}
}

func (e *env) rdb() *redis.Client {
	opt, err := redis.ParseURL(e.redis.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	c := redis.NewClient(opt)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// TestCrashPoints crashes the daemon at each place docs/design.md §4 names and
// checks that a restarted daemon ends exact: nothing lost, nothing
// applied twice.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	points := []struct {
		name string
		nth  int
	}{
		{failpoint.AfterApply, 5},
		{failpoint.MidTransaction, 300},
		{failpoint.BeforeCommit, 3},
		{failpoint.AfterCommit, 3},
		{failpoint.BeforeAck, 3},
	}
	for _, p := range points {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			fp := &failpoint.Set{}
			disarm := fp.CrashAfter(p.name, p.nth)
			defer disarm()
			d := e.start(func(o *Options) { o.Failpoints = fp })
			w := newWorkload(e.db)
			ctx, cancel := context.WithCancel(context.Background())
			loadDone := make(chan struct{})
			go func() { defer close(loadDone); w.run(ctx, 4, 400) }()
			err := d.wait(t, 2*time.Minute)
			if !errors.Is(err, failpoint.ErrCrash) {
				t.Fatalf("daemon returned %v, want the simulated crash", err)
			}
			disarm()
			<-loadDone
			cancel()
			w.report(t)
			// More traffic while walcount is down, then a new daemon.
			newWorkload(e.db).run(context.Background(), 2, 50)
			d2 := e.start()
			e.waitCaughtUp(catchUp)
			e.assertExact()
			if err := d2.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// underDisruption runs a workload of clients×ops against a daemon while
// disrupt breaks something, then checks that the counts end exact.
func underDisruption(t *testing.T, clients, ops int, disrupt func(e *env, w *workload)) {
	t.Helper()
	e := newEnv(t)
	d := e.start()
	w := newWorkload(e.db)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(context.Background(), clients, ops)
		w.ended.Store(true)
	}()
	disrupt(e, w)
	<-done
	w.report(t)
	// More traffic once everything is back.
	newWorkload(e.db).run(context.Background(), 2, 50)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestRedisFlushAllMidStream(t *testing.T) {
	t.Parallel()
	underDisruption(t, 4, 400, func(e *env, w *workload) {
		rdb := e.rdb()
		for i := 0; i < 3; i++ {
			w.waitOps(t, 150)
			if err := rdb.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestRedisKilledAndRestarted(t *testing.T) {
	t.Parallel()
	underDisruption(t, 4, 400, func(e *env, w *workload) {
		w.waitOps(t, 200)
		if err := e.redis.Kill(); err != nil {
			t.Fatal(err)
		}
		// Redis stays down until walcount noticed, the load going on.
		waitSessionDown(t, e.last)
		w.waitOps(t, 100)
		if err := e.redis.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPostgresCrashAndRestart(t *testing.T) {
	t.Parallel()
	underDisruption(t, 4, 600, func(e *env, w *workload) {
		w.waitOps(t, 250)
		ctx := context.Background()
		if err := e.pg.Stop(ctx, "immediate"); err != nil {
			t.Fatal(err)
		}
		// PostgreSQL stays down until walcount noticed.
		waitSessionDown(t, e.last)
		if err := e.pg.Start(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRewoundSlotReplays puts back an older copy of the slot, whose
// confirmed position is far behind W, and streams from it: the server
// resends transactions that are already counted, and they must be
// skipped (design rule 4).
func TestRewoundSlotReplays(t *testing.T) {
	t.Parallel()
	for _, wipeRedis := range []bool{false, true} {
		name := "redis kept"
		if wipeRedis {
			name = "redis wiped"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			if _, err := e.db.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, 'old_copy')", e.cfg.Slot); err != nil {
				t.Fatal(err)
			}
			d := e.start()
			newWorkload(e.db).run(ctx, 4, 200)
			e.waitCaughtUp(catchUp)
			e.assertExact()
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
			// Rewind: replace the slot with the old copy, once the
			// stopped daemon's walsender has let go of it.
			waitFor(t, "slot released", func() bool {
				var active bool
				err := e.db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&active)
				return err == nil && !active
			})
			if _, err := e.db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", e.cfg.Slot); err != nil {
				t.Fatal(err)
			}
			if _, err := e.db.Exec(ctx, "SELECT pg_copy_logical_replication_slot('old_copy', $1)", e.cfg.Slot); err != nil {
				t.Fatal(err)
			}
			if _, err := e.db.Exec(ctx, "SELECT pg_drop_replication_slot('old_copy')"); err != nil {
				t.Fatal(err)
			}
			if wipeRedis {
				if err := e.rdb().FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			d2 := e.start(func(o *Options) { o.replayFromSlot = true })
			e.moreLikesThenExact()
			if err := d2.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestIdleSlotAdvances writes heavily to a table walcount does not follow
// while likes is idle: heartbeats must keep the slot's lag bounded.
func TestIdleSlotAdvances(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.start()
	ctx := context.Background()
	e.waitCaughtUp(catchUp)
	var maxLag int64
	for round := 0; round < 15; round++ {
		if _, err := e.db.Exec(ctx, "INSERT INTO events (payload) SELECT repeat('x', 1000) FROM generate_series(1, 5000)"); err != nil {
			t.Fatal(err)
		}
		// Paces the bursts: the test samples the lag the heartbeats
		// leave between them, so the time between bursts is the
		// measurement, not a wait for an event.
		time.Sleep(200 * time.Millisecond)
		if round < 5 {
			continue // let the first heartbeats go round
		}
		var lag int64
		if err := e.db.QueryRow(ctx, "SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&lag); err != nil {
			t.Fatal(err)
		}
		maxLag = max(maxLag, lag)
	}
	t.Logf("max slot lag while likes idle and ~60MB of other WAL written: %d bytes", maxLag)
	// Each round writes ~6 MB of WAL; with heartbeats every 200ms the
	// slot trails by at most a few rounds. Without them it would trail by
	// everything written (~90 MB).
	if maxLag > 40<<20 {
		t.Fatalf("slot lag %d bytes: the slot does not advance while likes is idle", maxLag)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestTwoDaemonsOneSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a := e.start()
	waitFor(t, "first daemon streaming", func() bool { return a.d.Status(ctx).Streaming })
	b := e.start()
	waitFor(t, "second daemon waiting", func() bool { return b.d.Status(ctx).WaitingForSlot })
	newWorkload(e.db).run(ctx, 4, 150)
	if b.d.Status(ctx).Streaming {
		t.Fatal("second daemon streams while the first holds the slot")
	}
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second daemon takes over", func() bool { return b.d.Status(ctx).Streaming })
	newWorkload(e.db).run(ctx, 4, 150)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestTruncate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 100)
	if _, err := e.db.Exec(ctx, "TRUNCATE likes"); err != nil {
		t.Fatal(err)
	}
	newWorkload(e.db).run(ctx, 2, 100)
	// TRUNCATE inside a transaction, with likes before and after it.
	e.inTransaction(
		"INSERT INTO likes (post_id) VALUES (1), (2)",
		"TRUNCATE likes",
		"INSERT INTO likes (post_id) VALUES (1), (3), (3)",
	)
	e.moreLikesThenExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestDrainBacklog builds a 100k-like backlog while walcount is stopped
// and reports how fast it drains. It asserts exactness, not speed: the
// speed belongs to make bench.
func TestDrainBacklog(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT 1 + (g % 50) FROM generate_series(1, 1000) g"); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	d := e.start()
	e.waitCaughtUp(5 * time.Minute)
	took := time.Since(start)
	t.Logf("drained 100k likes (100 transactions of 1000 rows) in %s: %.0f likes/s", took, 100000/took.Seconds())
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !wait.Until(30*time.Second, 50*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for: %s", what)
	}
}

// TestPostgresFastShutdownWithDaemonConnected stops PostgreSQL the
// default way while walcount streams: the walsender waits for its client
// to confirm all WAL sent, so walcount must confirm past W when nothing
// is in flight, or the shutdown never ends.
func TestPostgresFastShutdownWithDaemonConnected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	// Unrelated WAL after the last like, as a busy database has.
	if _, err := e.db.Exec(ctx, "INSERT INTO events (payload) SELECT 'x' FROM generate_series(1, 1000)"); err != nil {
		t.Fatal(err)
	}
	// The unrelated WAL is sent to walcount, which confirms no
	// transaction of its in it: the shutdown must not wait on that.
	var flushed string
	if err := e.db.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&flushed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the walsender to send the unrelated WAL", func() bool {
		var sent bool
		err := e.db.QueryRow(ctx, `SELECT coalesce(bool_or(r.sent_lsn >= $1::pg_lsn), false)
FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $2`, flushed, e.cfg.Slot).Scan(&sent)
		return err == nil && sent
	})
	sctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.pg.Stop(sctx, "fast"); err != nil {
		t.Fatalf("fast shutdown with walcount connected: %v (after %s)", err, time.Since(start))
	}
	t.Logf("fast shutdown took %s with walcount connected", time.Since(start))
	if err := e.pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.moreLikesThenExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
