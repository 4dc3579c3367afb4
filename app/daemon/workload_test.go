package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// workload drives every kind of like traffic a Rails app produces, from
// several concurrent clients. Errors are tolerated and counted, because
// some tests restart servers under it: whatever committed, committed, and
// the counts must match whatever that is.
type workload struct {
	db      *pgxpool.Pool
	posts   int
	ok, bad atomic.Int64
	// ended is set once a finite run of the workload returned
	// (underDisruption's): waitOps has no more operations to wait for.
	ended atomic.Bool
}

func newWorkload(db *pgxpool.Pool) *workload { return &workload{db: db, posts: 50} }

// waitCommitted waits, a minute at most, until the workload has committed
// n more operations than when it was called: the load has gone on
// through whatever the test does meanwhile.
func (w *workload) waitCommitted(t testing.TB, n int64) {
	t.Helper()
	from := w.ok.Load()
	wait.For(t, time.Minute, fmt.Sprintf("%d more operations of the workload committed", n), func() bool {
		return w.ok.Load() >= from+n
	})
}

// waitOps is waitCommitted counting failed operations too (under a
// disruption that fails them, the load goes on all the same), and ending
// early when the workload has ended.
func (w *workload) waitOps(t testing.TB, n int64) {
	t.Helper()
	from := w.ok.Load() + w.bad.Load()
	wait.For(t, time.Minute, fmt.Sprintf("%d more operations of the workload", n), func() bool {
		return w.ok.Load()+w.bad.Load() >= from+n || w.ended.Load()
	})
}

// waitFlushes waits, a minute at most, until d has committed n more
// flushes than when it was called.
func waitFlushes(t testing.TB, d *running, n int64) {
	t.Helper()
	from := counterValue(d.d.m.Flushes)
	wait.For(t, time.Minute, fmt.Sprintf("%d more flushes", n), func() bool {
		return counterValue(d.d.m.Flushes) >= from+n
	})
}

// waitSessionDown waits until d has noticed a disruption: its session
// ended and it does not stream.
func waitSessionDown(t testing.TB, d *running) {
	t.Helper()
	wait.For(t, time.Minute, "walcount's session to end", func() bool { return !d.d.streaming() })
}

// run starts clients that each perform ops operations; it returns when
// all are done.
func (w *workload) run(ctx context.Context, clients, ops int) {
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		seed := uint64(c + 1)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(ops)))
			for i := 0; i < ops && ctx.Err() == nil; i++ {
				if err := w.op(ctx, rng); err != nil {
					w.bad.Add(1)
				} else {
					w.ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// background runs the workload, clients clients of ops operations at a
// time, again and again until the returned stop is called; stop waits for
// the clients to end and may be called more than once.
func (w *workload) background(clients, ops int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			w.run(ctx, clients, ops)
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

func (w *workload) post(rng *rand.Rand) int64 {
	// Skewed: post 1 is viral.
	if rng.IntN(3) == 0 {
		return 1
	}
	return int64(1 + rng.IntN(w.posts))
}

// op performs one random operation.
func (w *workload) op(ctx context.Context, rng *rand.Rand) error {
	switch k := rng.IntN(100); {
	case k < 35: // single like
		_, err := w.db.Exec(ctx, "INSERT INTO likes (post_id, user_id) VALUES ($1, $2)", w.post(rng), rng.Int64N(1000))
		return err
	case k < 45: // multi-row insert
		_, err := w.db.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1), ($2), ($3), ($1)", w.post(rng), w.post(rng), w.post(rng))
		return err
	case k < 60: // unlike
		_, err := w.db.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 ORDER BY random() LIMIT 1)", w.post(rng))
		return err
	case k < 65: // rolled back
		return w.tx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1)", w.post(rng)); err != nil {
				return err
			}
			return errRollback
		})
	case k < 72: // savepoint rolled back inside a committed transaction
		return w.tx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1)", w.post(rng)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1), ($1)", w.post(rng)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s")
			return err
		})
	case k < 78: // like and unlike in one transaction
		return w.tx(ctx, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, "INSERT INTO likes (post_id) VALUES ($1) RETURNING id", w.post(rng)).Scan(&id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DELETE FROM likes WHERE id = $1", id)
			return err
		})
	case k < 86: // move a like to another post
		_, err := w.db.Exec(ctx, "UPDATE likes SET post_id = $2 WHERE id = (SELECT id FROM likes WHERE post_id = $1 LIMIT 1)", w.post(rng), w.post(rng))
		return err
	case k < 90: // an update that changes nothing walcount counts
		_, err := w.db.Exec(ctx, "UPDATE likes SET user_id = user_id + 1 WHERE id = (SELECT id FROM likes WHERE post_id = $1 LIMIT 1)", w.post(rng))
		return err
	case k < 93: // COPY
		conn, err := w.db.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		rows := make([][]any, 1+rng.IntN(20))
		for i := range rows {
			rows[i] = []any{w.post(rng), int64(7)}
		}
		_, err = conn.Conn().CopyFrom(ctx, pgx.Identifier{"likes"}, []string{"post_id", "user_id"}, pgx.CopyFromRows(rows))
		return err
	case k < 97: // a long transaction interleaving with the others
		return w.tx(ctx, func(tx pgx.Tx) error {
			for i := 0; i < 5; i++ {
				if _, err := tx.Exec(ctx, "INSERT INTO likes (post_id) VALUES ($1)", w.post(rng)); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "DELETE FROM likes WHERE id = (SELECT id FROM likes WHERE post_id = $1 LIMIT 1)", w.post(rng))
			return err
		})
	default: // unrelated table traffic
		_, err := w.db.Exec(ctx, "INSERT INTO events (payload) VALUES ($1)", fmt.Sprint(rng.Int()))
		return err
	}
}

var errRollback = fmt.Errorf("rollback on purpose")

// tx runs fn in a transaction; errRollback rolls back without error.
func (w *workload) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		if err == errRollback {
			return nil
		}
		return err
	}
	return tx.Commit(ctx)
}

func (w *workload) report(t testing.TB) {
	t.Logf("workload: %d operations ok, %d failed", w.ok.Load(), w.bad.Load())
}

// runOps runs ops operations of op on each of clients connections at
// once, each client with a random source of its own, and fails t when an
// operation fails: any error, or with tolerate one whose SQLSTATE is not
// listed (a foreign key or unique violation the churn's races make).
func (w *workload) runOps(ctx context.Context, t testing.TB, clients, ops int, op func(context.Context, *workload, *rand.Rand) error, tolerate ...string) {
	t.Helper()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c+1), uint64(ops)*13+uint64(time.Now().UnixNano())))
			for range ops {
				if ctx.Err() != nil {
					return
				}
				err := op(ctx, w, rng)
				if err != nil && !slices.ContainsFunc(tolerate, func(code string) bool { return isCode(err, code) }) {
					if ctx.Err() == nil {
						w.bad.Add(1)
						t.Logf("operation: %v", err)
					}
				} else {
					w.ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	w.report(t)
	if w.bad.Load() > 0 {
		t.Fatalf("%d operations failed", w.bad.Load())
	}
}

// crashInBackfill is the opening of the counter-kind tests: a daemon
// starts on tables that have rows (a backfill on live tables) and crashes
// right after its crashAfter-th flush commit under load, more load comes
// while it is down, and a second daemon, returned, finishes the backfill
// under load. load(clients, ops) is the test's churn.
func (e *env) crashInBackfill(crashAfter int, load func(clients, ops int)) *running {
	e.t.Helper()
	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, crashAfter)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	load(3, 150)
	if err := d.wait(e.t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		e.t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	disarm()
	load(2, 50)
	d = e.start()
	load(3, 150)
	// The backfill the crash interrupted is done again by the new daemon.
	if run := waitRun(e.t, d, 0); run.Status != "done" {
		e.t.Fatalf("backfill %+v, want done", run)
	}
	return d
}
