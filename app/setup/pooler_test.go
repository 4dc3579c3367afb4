package setup_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// pgbouncer starts a PgBouncer of the test's own in transaction mode in
// front of the server of dbURL, and returns the pooled URL of the same
// database and user.
func pgbouncer(t *testing.T, dbURL string) string {
	t.Helper()
	return pgbouncerWith(t, dbURL, servers.PgBouncerOptions{PoolMode: "transaction"})
}

// pgbouncerWith is pgbouncer with the pool mode and aliases of opt.
func pgbouncerWith(t *testing.T, dbURL string, opt servers.PgBouncerOptions) string {
	t.Helper()
	return testenv.PgBouncer(t, dbURL, opt)
}

// TestPgBouncerTransactionMode: walcount's SQL pool through PgBouncer in
// transaction mode, its slot read directly (replication_url): setup, run
// under churn from an app that goes through the pooler too, a crash of
// the daemon, a new daemon, and the counters are exact.
func TestPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.Database(t)
	f := newFixture(t, direct)
	f.exec(t, "ALTER TABLE likes REPLICA IDENTITY FULL; INSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g; INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 50) g")
	pooled := pgbouncer(t, direct)

	opt := f.opts(likes)
	opt.Config.DatabaseURL, opt.Config.ReplicationURL = pooled, direct
	opt.Config.FlushInterval = 50 * time.Millisecond
	cfg := opt.Config
	conn, err := cfg.ConnectSQL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	slotConn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer slotConn.Close(ctx)
	opt.SlotConn = slotConn
	if _, err := setup.Run(ctx, conn, opt); err != nil {
		t.Fatalf("setup through the pooler: %v", err)
	}

	// The app writes through the pooler too.
	app, err := pgx.Connect(ctx, pooled+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	churnCtx, stopChurn := context.WithCancel(ctx)
	var churn sync.WaitGroup
	var rounds atomic.Int64
	churn.Add(1)
	go func() {
		defer churn.Done()
		for i := 0; churnCtx.Err() == nil; i++ {
			rounds.Add(1)
			_, _ = app.Exec(churnCtx, `INSERT INTO likes (post_id) SELECT 1 + (g * 3 + $1::int) % 20 FROM generate_series(1, 5) g`, i)
			_, _ = app.Exec(churnCtx, `DELETE FROM likes WHERE id IN (SELECT id FROM likes ORDER BY random() LIMIT 2)`)
		}
	}()
	defer func() { stopChurn(); churn.Wait() }()

	// A daemon that crashes before the commit of a flush, after it has
	// flushed a few times.
	fp := &failpoint.Set{}
	var flushes int
	var mu sync.Mutex
	fp.Arm(failpoint.BeforeCommit, func() error {
		mu.Lock()
		defer mu.Unlock()
		flushes++
		if flushes >= 5 {
			return failpoint.ErrCrash
		}
		return nil
	})
	d1, err := daemon.New(daemon.Options{Config: cfg, Failpoints: fp, RetryMin: 50 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := d1.Run(runCtx); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("first daemon through the pooler: %v, want the simulated crash", err)
	}
	d1.Close()

	d2, err := daemon.New(daemon.Options{Config: cfg, RetryMin: 50 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d2.Run(runCtx) }()
	// The churn goes on while the second daemon starts and streams.
	until := rounds.Load() + 30
	wait.For(t, 2*time.Minute, "30 more rounds of churn", func() bool { return rounds.Load() >= until })
	stopChurn()
	churn.Wait()
	waitExact(t, f.conn)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second daemon: %v", err)
	}
	d2.Close()
}

// TestReplicationURLAtThePooler: a replication connection that reaches
// PgBouncer is named as such, with the fix, by check and by run.
func TestReplicationURLAtThePooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.Database(t)
	f := newFixture(t, direct)
	f.exec(t, "ALTER TABLE likes REPLICA IDENTITY FULL")
	f.run(t, f.opts(likes))
	pooled := pgbouncer(t, direct)

	cfg := f.opts(likes).Config
	cfg.DatabaseURL, cfg.ReplicationURL = pooled+"&default_query_exec_mode=cache_describe", pooled
	findings, err := preflight.Run(ctx, preflight.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, fd := range findings {
		if fd.Check == preflight.CheckReplicationConn {
			found = true
			if fd.Severity != preflight.Problem || !strings.Contains(fd.Message, "connection pooler") || !strings.Contains(fd.Fix, "replication_url") {
				t.Errorf("replication connection at the pooler: %+v", fd)
			}
		}
	}
	if !found {
		t.Errorf("no %s finding: %v", preflight.CheckReplicationConn, findings)
	}

	d, err := daemon.New(daemon.Options{Config: cfg, RetryMin: 50 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.Run(runCtx); !errors.Is(err, cdc.ErrPooler) || !strings.Contains(err.Error(), "replication_url") {
		t.Fatalf("run with the replication URL at the pooler: %v, want %v with the fix", err, cdc.ErrPooler)
	}
}
