package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/testkit/servers"
)

func openPool(ctx context.Context, url string, conns int32) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = conns
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// inject runs one fault while the load goes on.
func (k *soak) inject(ctx context.Context, name string) error {
	switch name {
	case "kill -9":
		wc := k.walcount()
		_ = wc.cmd.Process.Signal(syscall.SIGKILL)
		<-wc.done
		return k.startWalcount(ctx)
	case "postgres restart":
		port := k.c.pg.Port()
		if err := k.c.pg.Stop(ctx, servers.StopFast); err != nil {
			return err
		}
		if err := k.c.pg.Start(ctx); err != nil {
			return err
		}
		if k.c.pg.Port() != port {
			return fmt.Errorf("postgres came back on another port (%d, not %d)", k.c.pg.Port(), port)
		}
		return k.restartIfExited(ctx)
	case "redis restart":
		if err := k.c.redis.Kill(); err != nil {
			return err
		}
		if err := k.c.redis.Start(ctx); err != nil {
			return err
		}
		return k.restartIfExited(ctx)
	case "row lock":
		return k.holdLocks(ctx)
	case "bulk insert":
		_, err := k.c.db.Exec(ctx, `INSERT INTO likes (post_id, user_id, hidden, weight)
SELECT g % $2, g % $3, g % 5 = 0, 1 + g % 5 FROM generate_series(1, $1::bigint) g`, k.s.bulk, soakPosts, soakUsers)
		return err
	case "reconcile":
		p, err := reconcilePass(ctx, k.walcount(), 0, 0)
		if err != nil {
			return err
		}
		k.summary = append(k.summary, fmt.Sprintf("reconcile under load: %d keys checked, %d drifted, %d corrected", p.checked, p.drifted, p.corrected))
		return nil
	case "slot recreate":
		return k.recreateSlot(ctx)
	case "failover":
		return k.failover(ctx)
	}
	return fmt.Errorf("unknown fault %q", name)
}

// restartIfExited starts walcount again when a server's restart made it
// exit (it is meant to ride one out), and says so in the summary.
func (k *soak) restartIfExited(ctx context.Context) error {
	// Give it a moment to notice.
	_ = pause(ctx, 2*time.Second)
	if err := k.walcount().alive(); err != nil {
		k.summary = append(k.summary, "walcount exited and was started again: "+firstLine(err.Error()))
		return k.startWalcount(ctx)
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// holdLocks holds the row of a hot post and the site-wide total's row
// from a second connection for lockHold, as an app's long transaction
// would; the flushes carry their keys meanwhile.
func (k *soak) holdLocks(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, k.c.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM posts WHERE id = 1 FOR UPDATE`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM site WHERE id = 1 FOR UPDATE`); err != nil {
		return err
	}
	var carried int64
	deadline := time.Now().Add(k.s.lockHold)
	for time.Now().Before(deadline) {
		if err := pause(ctx, time.Second); err != nil {
			return err
		}
		var n int64
		if err := k.c.db.QueryRow(ctx, `SELECT count(*) FROM walcount.carried`).Scan(&n); err == nil && n > carried {
			carried = n
		}
	}
	k.summary = append(k.summary, fmt.Sprintf("row lock: up to %d keys carried while held", carried))
	return tx.Commit(ctx)
}

// recreateSlot loses the slot as an operator would (walcount stopped, the
// slot dropped while the app writes) and recovers with `walcount setup
// --recreate-slot`, which marks every counter dirty; run repairs them.
func (k *soak) recreateSlot(ctx context.Context) error {
	if err := k.walcount().stop(); err != nil {
		return err
	}
	if _, err := k.c.db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, config.DefaultSlot); err != nil {
		return err
	}
	_ = pause(ctx, 5*time.Second) // changes the new slot will never see
	cmd := exec.CommandContext(ctx, k.b.bin, "setup", "--recreate-slot", "--config", k.cfgPath,
		"--database-url", k.c.url, "--redis-url", k.c.redis.URL())
	cmd.Env = append(os.Environ(), "WALCOUNT_CONFIG=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("setup --recreate-slot: %w: %s", err, out)
	}
	return k.startWalcount(ctx)
}

// quietPoint stops nothing (the caller stopped the load), waits until
// walcount has applied everything, carries nothing and has repaired what
// it marked dirty, then compares every counter with its source.
func (k *soak) quietPoint(ctx context.Context, after string) error {
	q := quietPoint{at: time.Since(k.started), after: after}
	began := time.Now()
	settled, note, err := k.settle(ctx)
	if err != nil {
		return err
	}
	q.settled = time.Since(began)
	if !settled {
		q.note = note
	}
	if q.off, err = k.verifyAll(ctx); err != nil {
		return err
	}
	if q.rows, err = k.stateRows(ctx); err != nil {
		return err
	}
	state := "exact"
	if !q.exact() {
		state = fmt.Sprintf("OFF %v", q.off)
		k.diagnose(ctx)
		// Off for good, or still draining? The same check later.
		_ = pause(ctx, 10*time.Second)
		if again, err := k.verifyAll(ctx); err == nil {
			q.note = strings.TrimSpace(q.note + fmt.Sprintf(" 10 s later: %v", again))
		}
	}
	k.b.logf("soak %s: quiet point after %s: settled in %s %s; %s; state rows %v",
		q.at.Round(time.Second), after, q.settled.Round(time.Millisecond), q.note, state, q.rows)
	k.quiet = append(k.quiet, q)
	return nil
}

// settle waits, settleLimit at most, until two rounds in a row find
// nothing left: a round emits a mark, waits until W passes it, and finds
// walcount.carried and walcount.dirty empty and no reconciliation pending
// or running. Two, because the multi-level and the via counters count
// walcount's own flushes of posts and of the via table from the WAL: what
// a round's flush wrote is applied one level up by the next round's. And
// a round that found keys carried does not count: a flush that moved W
// past the mark and staged its batch in walcount.carried (a big batch, or
// rows slower than flush_lock_time) applies it in pieces after the mark,
// and the level above them sees the pieces' updates only after that.
func (k *soak) settle(ctx context.Context) (bool, string, error) {
	deadline := time.Now().Add(k.s.settleLimit)
	note := ""
	clean := 0
	for time.Now().Before(deadline) {
		if err := k.walcount().alive(); err != nil {
			k.summary = append(k.summary, "walcount had exited at a quiet point and was started again: "+firstLine(err.Error()))
			if err := k.startWalcount(ctx); err != nil {
				return false, "", err
			}
		}
		if err := k.c.caughtUp(ctx, time.Until(deadline)); err != nil {
			note = "not caught up: " + err.Error()
			clean = 0
			continue
		}
		var carried, dirty, open int64
		err := k.c.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM walcount.carried), (SELECT count(*) FROM walcount.dirty),
  (SELECT count(*) FROM walcount.reconcile_runs WHERE status IN ('pending', 'running'))`).Scan(&carried, &dirty, &open)
		switch {
		case err != nil:
			note, clean = err.Error(), 0
		case carried == 0 && dirty == 0 && open == 0:
			if clean++; clean >= 2 {
				return true, "", nil
			}
			continue
		default:
			note, clean = fmt.Sprintf("%d carried, %d dirty, %d runs open", carried, dirty, open), 0
		}
		if err := pause(ctx, 500*time.Millisecond); err != nil {
			return false, "", err
		}
	}
	return false, "did not settle in " + k.s.settleLimit.String() + ": " + note, nil
}

// verifyAll returns, per counter, how many target rows differ from their
// source.
func (k *soak) verifyAll(ctx context.Context) (map[string]int64, error) {
	off := map[string]int64{}
	for _, ch := range soakChecks {
		var bad, total int64
		if err := k.c.db.QueryRow(ctx, ch.sql).Scan(&bad, &total); err != nil {
			return nil, fmt.Errorf("verify %s: %w", ch.counter, err)
		}
		off[ch.counter] = bad
	}
	return off, nil
}

// diagnose logs what walcount still holds when a counter is off.
func (k *soak) diagnose(ctx context.Context) {
	rows, err := k.c.db.Query(ctx, `SELECT 'carried', counter, key, delta::text, coalesce(parked_error, '') FROM walcount.carried
UNION ALL SELECT 'dirty', counter, coalesce(key, '*'), '', cause FROM walcount.dirty LIMIT 40`)
	if err != nil {
		k.b.logf("  diagnose: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var kind, counter, key, delta, why string
		if rows.Scan(&kind, &counter, &key, &delta, &why) == nil {
			k.b.logf("  %s %s %s %s %s", kind, counter, key, delta, why)
		}
	}
}

// stateTables are walcount's tables sampled and reported.
var stateTables = []struct{ name, sql string }{
	{"via", `SELECT count(*) FROM walcount.via_user_karma`},
	{"carried", `SELECT count(*) FILTER (WHERE parked_error IS NULL) FROM walcount.carried`},
	{"parked", `SELECT count(*) FILTER (WHERE parked_error IS NOT NULL) FROM walcount.carried`},
	{"dirty", `SELECT count(*) FROM walcount.dirty`},
	{"runs", `SELECT count(*) FROM walcount.reconcile_runs`},
	{"messages", `SELECT count(*) FROM walcount.messages`},
}

func (k *soak) stateRows(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	var errs []error
	for _, t := range stateTables {
		var n int64
		if err := k.c.db.QueryRow(ctx, t.sql).Scan(&n); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.name, err))
			continue
		}
		out[t.name] = n
	}
	return out, errors.Join(errs...)
}
