package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/state"
)

// standbyEnv is an env whose slot lives on a hot standby of its primary
// (decoding on a standby, PostgreSQL 16 and later): replication_url names
// the standby, database_url both hosts with target_session_attrs=read-write
// so that a promotion of the standby moves the SQL pool there too. The
// app's pool does the same. Below PostgreSQL 16 the test is skipped.
func standbyEnv(t *testing.T) (*env, *servers.Postgres) {
	t.Helper()
	// The standby applies each commit a second after the primary made
	// it: markers, flushes and reconciliation wait for replay.
	return standbyEnvWith(t, map[string]string{"recovery_min_apply_delay": "1s"})
}

// standbyEnvWith is standbyEnv with the standby's settings.
func standbyEnvWith(t *testing.T, settings map[string]string) (*env, *servers.Postgres) {
	t.Helper()
	ctx := context.Background()
	var standby *servers.Postgres
	e := newEnvWith(t, schema, func(e *env) {
		if e.pg.Major() < 16 {
			t.Skipf("decoding on a standby needs PostgreSQL 16 or later; WALCOUNT_TEST_PG selects %d", e.pg.Major())
		}
		var err error
		standby, err = e.pg.StartStandby(ctx, servers.StandbyOptions{Settings: settings})
		if err != nil {
			t.Fatalf("start standby: %v", err)
		}
		t.Cleanup(func() { _ = standby.Close() })
		multi := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			e.pg.Port(), standby.Port())
		e.db.Close()
		if e.db, err = pgxpool.New(ctx, multi); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.db.Close)
		e.cfg.DatabaseURL = multi
		e.cfg.ReplicationURL = standby.URL()
	})
	return e, standby
}

// TestDecodeOnStandby runs walcount with its slot on a hot standby through
// the churn load, while walcount is killed (a crash right after a flush
// committed, before Redis and the slot heard of it), the standby is
// restarted, and finally the primary is stopped and the standby promoted:
// walcount goes on with the same slot, now on a primary. The standby is
// promoted while it lags (its WAL receiver stopped): every post is exact
// at the end, without a repair, because the slot was never confirmed past
// a W the standby had not replayed (the gate's wait for replay), so the
// promoted standby's checkpoint is never behind its slot.
func TestDecodeOnStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, standby := standbyEnv(t)
	sb, err := pgxpool.New(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if !hasSlot(t, sb, e.cfg.Slot) {
		t.Fatalf("setup did not create slot %s on the standby", e.cfg.Slot)
	}

	fp := &failpoint.Set{}
	disarm := fp.CrashAfter(failpoint.AfterCommit, 10)
	d := e.start(func(o *Options) { o.Failpoints = fp })
	w := newWorkload(e.db)
	stopLoad := w.background(2, 20)
	defer stopLoad()

	// walcount killed after a flush committed.
	if err := d.wait(t, 2*time.Minute); err == nil {
		t.Fatal("daemon stopped without the simulated crash")
	}
	disarm()
	d = e.start()
	waitStreamingSince(t, d, time.Now().Add(-time.Hour))
	e.waitCaughtUp(catchUp)

	// The standby restarted under load.
	restarted := time.Now()
	if err := standby.Stop(ctx, servers.StopFast); err != nil {
		t.Fatal(err)
	}
	w.waitCommitted(t, 30) // the app goes on writing to the primary
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitStreamingSince(t, d, restarted)
	e.waitCaughtUp(catchUp)

	// The standby promoted while it lags: its WAL receiver stops while it
	// still has a second of WAL to apply, so walcount goes on receiving
	// and flushing what it applies, and the standby never has those
	// flushes; then the primary goes away, the standby
	// is promoted, the app and walcount find the new primary by
	// themselves, and the slot stays where it is.
	// Cut off from the primary without a crash (a killed process would
	// make the standby restart and forget what the slot confirmed since
	// its last restartpoint): its WAL receiver ends and retries a port
	// where nothing listens.
	if _, err := sb.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 connect_timeout=1'"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	// The standby applies what it has and walcount flushes it on the
	// primary, flushes the standby will never have. Neither end is an
	// event walcount or the servers report (a flush may or may not
	// follow the last record applied), so the test gives it time.
	time.Sleep(1500 * time.Millisecond)
	if err := e.pg.Stop(ctx, servers.StopImmediate); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	waitStreamingSince(t, d, promoted)
	w.waitCommitted(t, 50) // writes to the new primary
	stopLoad()
	w.report(t)
	e.waitCaughtUp(2 * time.Minute)
	// No repair, and nothing for a reconciliation to correct: there
	// were no likes before walcount started.
	var repairs, corrected int64
	if err := e.db.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'dirty'), coalesce(sum(corrected), 0) FROM walcount.reconcile_runs").Scan(&repairs, &corrected); err != nil {
		t.Fatal(err)
	}
	marks, err := state.ListDirty(ctx, e.db, e.cfg.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if repairs != 0 || corrected != 0 || len(marks) != 0 {
		t.Errorf("decoding on the standby needed a repair: %d dirty runs, %d corrections, marks %+v", repairs, corrected, marks)
	}
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// waitStreamingSince waits until the daemon streams in a session that
// started after since.
func waitStreamingSince(t *testing.T, d *running, since time.Time) {
	t.Helper()
	waitFor(t, "walcount streaming", func() bool {
		st := d.d.Status(context.Background())
		return st.Streaming && st.SessionStart != nil && st.SessionStart.After(since)
	})
}

// TestStandbySlotConflictNamesCause: the standby that holds the slot runs
// without hot_standby_feedback, and VACUUM on the primary removes catalog
// rows the slot still needs. The standby invalidates the slot (a conflict
// with recovery) and walcount stops with an error that names the cause
// and the fix, as walcount status shows it.
func TestStandbySlotConflictNamesCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, standby := standbyEnvWith(t, nil)
	sb, err := pgxpool.New(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	// Set up as check requires, then turned off.
	for _, q := range []string{"ALTER SYSTEM SET hot_standby_feedback = off", "SELECT pg_reload_conf()"} {
		if _, err := sb.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the primary no longer holding rows for the standby", func() bool {
		var held bool
		return e.db.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_type = 'physical' AND (xmin IS NOT NULL OR catalog_xmin IS NOT NULL))").Scan(&held) == nil && !held
	})
	// Catalog rows newer than the slot's catalog_xmin die and are removed.
	// (Created and dropped in two transactions: rows a transaction both
	// inserted and deleted conflict with nothing.)
	e.exec("CREATE TABLE doomed (id int)")
	e.exec("DROP TABLE doomed")
	e.exec("VACUUM pg_class, pg_attribute, pg_type, pg_depend")
	waitFor(t, "the standby invalidating the slot", func() bool {
		_, _ = e.db.Exec(ctx, "SELECT pg_log_standby_snapshot()")
		var conflicting bool
		return sb.QueryRow(ctx, "SELECT coalesce(conflicting, false) FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&conflicting) == nil && conflicting
	})
	d := e.start()
	err = d.wait(t, time.Minute)
	if !isSlotLost(err) || !strings.Contains(err.Error(), "hot_standby_feedback = on") {
		t.Fatalf("daemon returned %v, want a lost slot that names hot_standby_feedback", err)
	}
	t.Logf("stopped with: %v", err)
}

// TestStandbySlotFollowsNewPrimary: three servers. walcount decodes on
// standby S1 of primary P; P fails over to its other standby S2 (the
// documented path of docs/operations.md: P stops, S2 is promoted, S1 is
// repointed at S2 by primary_conninfo, as any standby is). S1's slot
// stays, walcount goes on decoding there (a new timeline in the middle of
// its stream) and flushes into S2, which the multi-host database_url
// finds by itself, as the app's pool does. Every post is exact at the
// end, with no repair: P stopped cleanly, so S1 and S2 both had all of
// its WAL, and the slot was never confirmed past what S1 had received.
func TestStandbySlotFollowsNewPrimary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var s1, s2 *servers.Postgres
	e := newEnvWith(t, schema, func(e *env) {
		if e.pg.Major() < 16 {
			t.Skipf("decoding on a standby needs PostgreSQL 16 or later; WALCOUNT_TEST_PG selects %d", e.pg.Major())
		}
		s1, s2 = twoStandbys(t, e)
		var err error
		multi := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			e.pg.Port(), s2.Port())
		e.db.Close()
		if e.db, err = pgxpool.New(ctx, multi); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.db.Close)
		e.cfg.DatabaseURL = multi
		e.cfg.ReplicationURL = s1.URL()
	})
	sb1, err := pgxpool.New(ctx, s1.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb1.Close()

	d := e.start()
	w := newWorkload(e.db)
	stopLoad := w.background(2, 20)
	defer stopLoad()
	waitStreamingSince(t, d, time.Now().Add(-time.Hour))
	e.waitCaughtUp(catchUp)
	// Flushes into P under load.
	w.waitCommitted(t, 50)
	waitFlushes(t, d, 2)

	// P fails over to S2: a clean stop (its walsenders send both
	// standbys everything first), S2 promoted, a physical slot for S1 on
	// S2, and S1 repointed at it with a reload (no restart of S1).
	if err := e.pg.Stop(ctx, servers.StopFast); err != nil {
		t.Fatal(err)
	}
	failedOver := time.Now()
	if err := s2.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	sb2, err := pgxpool.New(ctx, s2.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	if _, err := sb2.Exec(ctx, "SELECT pg_create_physical_replication_slot('s1', true)"); err != nil {
		t.Fatal(err)
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=s1", s2.Port())
	if _, err := sb1.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = '"+conninfo+"'"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb1.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	// S1 streams from S2 and replays its new timeline.
	okAtFailover := w.ok.Load()
	waitFor(t, "S1 streaming from S2", func() bool {
		var n int
		err := sb2.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = 's1' AND state = 'streaming'").Scan(&n)
		return err == nil && n == 1
	})
	// The app writes to S2; walcount decodes it on S1 and flushes it into S2.
	w.waitCommitted(t, 50)
	waitFlushes(t, d, 2)
	stopLoad()
	w.report(t)
	if w.ok.Load() == okAtFailover {
		t.Fatal("the load wrote nothing into S2")
	}
	e.waitCaughtUp(2 * time.Minute)
	if !hasSlot(t, sb1, e.cfg.Slot) {
		t.Fatalf("slot %s is no longer on S1", e.cfg.Slot)
	}
	var repairs, corrected int64
	if err := e.db.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'dirty'), coalesce(sum(corrected), 0) FROM walcount.reconcile_runs").Scan(&repairs, &corrected); err != nil {
		t.Fatal(err)
	}
	if repairs != 0 || corrected != 0 {
		t.Errorf("the failover to S2 needed a repair: %d dirty runs, %d corrections", repairs, corrected)
	}
	e.assertExact()
	st := d.d.Status(ctx)
	if st.SessionStart != nil {
		t.Logf("walcount's session started %s after the failover", st.SessionStart.Sub(failedOver).Round(time.Millisecond))
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestStandbyHoldingSlotLost: the standby that holds the slot (S1) is lost
// for good under load, with on_slot_loss: recreate. replication_url names
// S1 and another standby S2 (multi-host, as database_url may): walcount
// connects to S2, finds no slot there, creates it (on a standby: it waits
// for a running-xacts record, which it asks the primary to log), and
// repairs every counter by reconciliation, since what S1's slot had sent
// but W had not recorded is gone with it. Every post ends exact.
func TestStandbyHoldingSlotLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var s1, s2 *servers.Postgres
	e := newEnvWith(t, schema, func(e *env) {
		if e.pg.Major() < 16 {
			t.Skipf("decoding on a standby needs PostgreSQL 16 or later; WALCOUNT_TEST_PG selects %d", e.pg.Major())
		}
		s1, s2 = twoStandbys(t, e)
		e.db.Reset() // the standbys' copies restarted the primary
		e.cfg.ReplicationURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable", s1.Port(), s2.Port())
		e.cfg.OnSlotLoss = config.SlotLossRecreate
	})
	sb1, err := pgxpool.New(ctx, s1.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb1.Close()
	if !hasSlot(t, sb1, e.cfg.Slot) {
		t.Fatalf("setup did not create slot %s on S1", e.cfg.Slot)
	}
	sb1.Close()

	d := e.start()
	waitRun(t, d, 0) // the first start's backfill
	w := newWorkload(e.db)
	stopLoad := w.background(2, 20)
	defer stopLoad()
	w.waitCommitted(t, 50)
	lost := time.Now()
	if err := s1.Close(); err != nil { // stopped at once and its data gone
		t.Fatal(err)
	}
	waitStreamingSince(t, d, lost)
	// The load goes on, decoded on S2 now.
	w.waitCommitted(t, 50)
	waitFlushes(t, d, 2)
	stopLoad()
	w.report(t)
	e.waitCaughtUp(2 * time.Minute)
	e.waitClean(t, 2*time.Minute)
	sb2, err := pgxpool.New(ctx, s2.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	if !hasSlot(t, sb2, e.cfg.Slot) {
		t.Fatalf("walcount did not recreate slot %s on S2", e.cfg.Slot)
	}
	var repairs int64
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty'").Scan(&repairs); err != nil {
		t.Fatal(err)
	}
	if repairs == 0 {
		t.Error("the recreated slot was not followed by a repair")
	}
	t.Logf("PostgreSQL %d: streaming from S2 %s after S1 was lost, exact after %s",
		e.pg.Major(), d.d.Status(ctx).SessionStart.Sub(lost).Round(time.Millisecond), time.Since(lost).Round(time.Millisecond))
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// twoStandbys starts two standbys of e's primary, S1 and S2 (physical
// slots s1 and s2 there), for the tests of three servers. Neither
// synchronises slots from the primary (PostgreSQL 17+): a slot on S1 is
// S1's own.
func twoStandbys(t *testing.T, e *env) (s1, s2 *servers.Postgres) {
	t.Helper()
	ctx := context.Background()
	var sopt servers.StandbyOptions
	if e.pg.Major() >= 17 {
		sopt.Settings = map[string]string{"sync_replication_slots": "off"}
	}
	var err error
	sopt.Name = "s2"
	if s2, err = e.pg.StartStandby(ctx, sopt); err != nil {
		t.Fatalf("start standby S2: %v", err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	sopt.Name = "s1"
	if s1, err = e.pg.StartStandby(ctx, sopt); err != nil {
		t.Fatalf("start standby S1: %v", err)
	}
	t.Cleanup(func() { _ = s1.Close() })
	return s1, s2
}

// hasSlot reports whether the server db reaches holds replication slot
// slot.
func hasSlot(t *testing.T, db *pgxpool.Pool, slot string) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&ok); err != nil {
		t.Fatalf("read the slots: %v", err)
	}
	return ok
}
