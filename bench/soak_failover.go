package main

// The soak's failover (PostgreSQL 17 and later): a hot standby of the
// primary keeps a synchronised copy of walcount's failover slot; the fault
// stops the primary (immediate), promotes the standby and makes a fresh
// standby of the new primary, on the old primary's port, for the next
// failover. The app, the soak's pool and walcount name both ports in one
// multi-host URL with target_session_attrs=read-write, so walcount keeps
// running and every client finds the new primary by itself, as the two
// servers swap roles from one failover to the next.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/testkit/servers"
)

// failoverMajor is the first PostgreSQL major version with failover slots.
const failoverMajor = 17

// soakFaultsFor returns the rotation of a soak on a PostgreSQL major: the
// faults asked for, or every fault the server can take, and a note for
// the summary when the failover is left out. A failover asked for on a
// server older than 17 is an error.
func soakFaultsFor(major int, asked []string) ([]string, string, error) {
	if len(asked) > 0 {
		if slices.Contains(asked, "failover") && major < failoverMajor {
			return nil, "", fmt.Errorf("soak: the failover fault needs PostgreSQL %d or later (failover slots); this is %d", failoverMajor, major)
		}
		return asked, "", nil
	}
	if major >= failoverMajor {
		return soakFaults, "", nil
	}
	out := slices.DeleteFunc(slices.Clone(soakFaults), func(f string) bool { return f == "failover" })
	return out, fmt.Sprintf("failover left out: PostgreSQL %d has no failover slots (%d and later)", major, failoverMajor), nil
}

// multiHostURL names both servers; only the primary takes the session.
func multiHostURL(a, b int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write", a, b)
}

// startFailoverPair starts the first standby of the soak's primary and
// moves the soak's pool to the multi-host URL walcount and the clients
// use from then on.
func (k *soak) startFailoverPair(ctx context.Context) error {
	if err := k.startStandby(ctx, 0); err != nil {
		return err
	}
	k.c.url = multiHostURL(k.c.pg.Port(), k.standby.Port())
	db, err := openPool(ctx, k.c.url, 8)
	if err != nil {
		return err
	}
	k.c.db.Close()
	k.c.db = db
	return nil
}

// startStandby makes a hot standby of the primary on port (0: any) whose
// slot sync worker copies walcount's failover slot, and names its physical
// slot in the primary's synchronized_standby_slots: the primary sends
// walcount no change the standby lacks, and walcount's standby gate holds
// W back until the standby has the flush that wrote it (design rule 16).
// The standby is a cold copy: the primary restarts (fast).
func (k *soak) startStandby(ctx context.Context, port int) error {
	sb, err := k.c.pg.StartStandby(ctx, servers.StandbyOptions{Port: port})
	if err != nil {
		return err
	}
	k.standby = sb
	return k.c.pg.SetSynchronizedStandbySlots(ctx, sb.StandbySlot())
}

func (k *soak) closeStandby() {
	if k.standby != nil {
		_ = k.standby.Close()
	}
}

// failover stops the primary at once, promotes the standby, waits until
// walcount applies what the app writes to the new primary, and makes a
// fresh standby of it on the old primary's port. walcount is not
// restarted: its multi-host URL finds the new primary (it is started
// again only if it exited, and the summary says so).
func (k *soak) failover(ctx context.Context) error {
	old, sb := k.c.pg, k.standby
	if sb == nil {
		return fmt.Errorf("no standby (the soak starts one when failover is in the rotation)")
	}
	synced, err := k.waitSynced(ctx, sb, 2*time.Minute)
	if err != nil {
		return err
	}
	var lastRun int64
	if err := k.c.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM walcount.reconcile_runs`).Scan(&lastRun); err != nil {
		return err
	}
	stopped := time.Now()
	if err := old.Stop(ctx, servers.StopImmediate); err != nil {
		return err
	}
	if err := sb.Promote(ctx); err != nil {
		return err
	}
	promoted := time.Since(stopped)
	port := old.Port()
	_ = old.Close()
	k.c.pg, k.standby = sb, nil
	// walcount follows: it applies what the app writes to the new primary.
	if err := k.restartIfExited(ctx); err != nil {
		return err
	}
	if err := k.c.caughtUp(ctx, 3*time.Minute); err != nil {
		return fmt.Errorf("walcount on the new primary: %w", err)
	}
	following := time.Since(stopped)
	if err := k.startStandby(ctx, port); err != nil {
		return fmt.Errorf("a standby of the new primary on port %d: %w", port, err)
	}
	if err := k.restartIfExited(ctx); err != nil {
		return err
	}
	k.failoverRun = lastRun
	k.summary = append(k.summary, fmt.Sprintf("failover from port %d to %d: slot synced on the standby after %s, promoted %s after the stop, walcount applying the new primary's writes after %s, a new standby on port %d after %s",
		port, sb.Port(), synced.Round(time.Second), promoted.Round(100*time.Millisecond), following.Round(100*time.Millisecond),
		port, time.Since(stopped).Round(time.Second)))
	return nil
}

// failoverRepairs says, at the quiet point after a failover, what walcount
// repaired since the failover began: the reconciliation runs of dirty keys
// and how many keys they measured. A slot lost in the failover would be a
// repair of every counter (and with on_slot_loss: stop, walcount exits).
func (k *soak) failoverRepairs(ctx context.Context) {
	var runs, keys, counters int64
	err := k.c.db.QueryRow(ctx, `SELECT count(*), coalesce(sum(total), 0),
  (SELECT count(DISTINCT c) FROM walcount.reconcile_runs, unnest(counters) c WHERE id > $1 AND kind = 'dirty')
FROM walcount.reconcile_runs WHERE id > $1 AND kind = 'dirty'`, k.failoverRun).Scan(&runs, &keys, &counters)
	if err != nil {
		k.summary = append(k.summary, "failover: repairs not read: "+err.Error())
		return
	}
	var all int64
	_ = k.c.db.QueryRow(ctx, `SELECT count(*) FROM walcount.reconcile_runs WHERE id > $1`, k.failoverRun).Scan(&all)
	k.summary = append(k.summary, fmt.Sprintf("failover: by its quiet point %d runs since it began, %d of them repairs of dirty keys (%d counters, %d keys measured)", all, runs, counters, keys))
}

// waitSynced waits, within at most, until the standby holds a persistent,
// valid copy of walcount's failover slot (synced, not temporary), which it
// makes only once the slot's position passed a running-xacts record it
// replayed: it logs one on the primary each round. It returns how long it
// waited; an operator's runbook checks the same before a failover.
func (k *soak) waitSynced(ctx context.Context, sb *servers.Postgres, within time.Duration) (time.Duration, error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	db, err := pgxpool.New(ctx, sb.URL())
	if err != nil {
		return 0, err
	}
	defer db.Close()
	for {
		_, _ = k.c.db.Exec(ctx, `SELECT pg_log_standby_snapshot()`)
		var synced bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots
  WHERE slot_name = $1 AND synced AND failover AND NOT temporary AND invalidation_reason IS NULL)`, config.DefaultSlot).Scan(&synced)
		if err == nil && synced {
			return time.Since(began), nil
		}
		if perr := pause(ctx, 500*time.Millisecond); perr != nil {
			return 0, fmt.Errorf("the standby's copy of slot %s not synced within %s (last error: %v)", config.DefaultSlot, within, err)
		}
	}
}
