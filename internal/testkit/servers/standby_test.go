package servers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// standbyTimeout bounds a standby test: two cold copies and starts, and on a
// busy machine the slot sync worker's naps, which grow up to 30 s.
const standbyTimeout = 3 * time.Minute

// startStandby makes a standby of primary that the test's cleanup closes.
func startStandby(tb testing.TB, ctx context.Context, primary *servers.Postgres, opt servers.StandbyOptions) *servers.Postgres {
	tb.Helper()
	s, err := primary.StartStandby(ctx, opt)
	if err != nil {
		tb.Fatalf("StartStandby: %v\nprimary log:\n%s", err, primary.LogTail(20))
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("standby %s log:\n%s", opt.Name, s.LogTail(40))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("close standby: %v", err)
		}
	})
	return s
}

// mustExec runs a statement and fails the test on error.
func mustExec(tb testing.TB, ctx context.Context, conn *pgx.Conn, sql string, args ...any) {
	tb.Helper()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

func TestStandbyFollowsAndPromotes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	primary := startPostgres(t, servers.PostgresOptions{})
	conn := connect(t, primary)
	mustExec(t, ctx, conn, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
	port := primary.Port()

	standby := startStandby(t, ctx, primary, servers.StandbyOptions{Name: "s1"})
	if standby.StandbySlot() != "s1" || primary.StandbySlot() != "" {
		t.Errorf("StandbySlot() = %q on the standby, %q on the primary; want s1 and \"\"", standby.StandbySlot(), primary.StandbySlot())
	}
	if primary.Port() != port || !primary.Running() {
		t.Fatalf("primary after StartStandby: port %d (was %d), running %v", primary.Port(), port, primary.Running())
	}
	if standby.Port() == port || standby.DataDir() == primary.DataDir() {
		t.Fatalf("standby shares the primary's port %d or data directory %s", port, primary.DataDir())
	}

	// The cold copy restarted the primary: the old session is gone.
	conn = connect(t, primary)
	mustExec(t, ctx, conn, "INSERT INTO t VALUES (2)")
	if err := standby.WaitCaughtUp(ctx); err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
	}
	sconn := connect(t, standby)
	if got := queryString(t, sconn, "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"); got != "1,2" {
		t.Errorf("rows on the standby = %s, want 1,2", got)
	}
	if got := queryString(t, sconn, "SELECT pg_is_in_recovery()::text"); got != "true" {
		t.Errorf("pg_is_in_recovery() on the standby = %s", got)
	}
	if got := queryString(t, conn, "SELECT string_agg(slot_type || ':' || active::text, ',') FROM pg_replication_slots WHERE slot_name = 's1'"); got != "physical:true" {
		t.Errorf("slot s1 on the primary = %q, want an active physical slot", got)
	}
	if got := queryString(t, conn, "SELECT count(*)::text FROM pg_stat_replication WHERE application_name = 's1'"); got != "1" {
		t.Errorf("walsenders for application_name s1 = %s, want 1", got)
	}
	if _, err := sconn.Exec(ctx, "INSERT INTO t VALUES (3)"); err == nil {
		t.Error("INSERT on the standby succeeded")
	}
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := standby.WaitReplayed(ctx, lsn); err != nil {
		t.Fatalf("WaitReplayed(%s): %v", lsn, err)
	}
	if replayed, err := standby.ReplayLSN(ctx); err != nil || replayed == "" {
		t.Errorf("ReplayLSN() = %q, %v", replayed, err)
	}

	if err := primary.Promote(ctx); !errors.Is(err, servers.ErrNotStandby) {
		t.Errorf("Promote on the primary = %v, want ErrNotStandby", err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	// Sessions survive the promotion and may now write.
	mustExec(t, ctx, sconn, "INSERT INTO t VALUES (3)")
	if got := queryString(t, sconn, "SELECT pg_is_in_recovery()::text"); got != "false" {
		t.Errorf("pg_is_in_recovery() after Promote = %s", got)
	}
	sconn.Close(ctx)

	// The promoted standby is a cluster like any other.
	if err := standby.Stop(ctx, servers.StopFast); err != nil {
		t.Fatalf("Stop the promoted standby: %v", err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatalf("Start the promoted standby: %v", err)
	}
	sconn = connect(t, standby)
	if got := queryString(t, sconn, "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"); got != "1,2,3" {
		t.Errorf("rows on the promoted standby = %s, want 1,2,3", got)
	}
	// The old primary did not see the write.
	if got := queryString(t, conn, "SELECT count(*)::text FROM t"); got != "2" {
		t.Errorf("rows on the old primary = %s, want 2", got)
	}
}

func TestStandbyOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	primary := startPostgres(t, servers.PostgresOptions{})
	if _, err := primary.StartStandby(ctx, servers.StandbyOptions{Name: "Bad-Name"}); err == nil {
		t.Error("StartStandby with name Bad-Name succeeded")
	}
	// A standby that receives WAL but applies none of it for an hour.
	standby := startStandby(t, ctx, primary, servers.StandbyOptions{
		Settings: map[string]string{"recovery_min_apply_delay": "1h"},
	})
	if standby.StandbySlot() != servers.DefaultStandbyName {
		t.Errorf("StandbySlot() = %q, want %q", standby.StandbySlot(), servers.DefaultStandbyName)
	}
	sconn := connect(t, standby)
	if got := queryString(t, sconn, "SHOW recovery_min_apply_delay"); got != "1h" {
		t.Errorf("recovery_min_apply_delay = %s, want 1h", got)
	}
	for _, name := range []string{"hot_standby", "hot_standby_feedback"} {
		if got := queryString(t, sconn, "SHOW "+name); got != "on" {
			t.Errorf("%s = %s, want on", name, got)
		}
	}
	conn := connect(t, primary)
	mustExec(t, ctx, conn, "CREATE TABLE delayed (id int)")
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The WAL arrives (it is flushed on the standby) but is not applied.
	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	if err := pollTrue(waitCtx, sconn, "SELECT pg_last_wal_receive_lsn() >= $1::pg_lsn", lsn); err != nil {
		t.Fatalf("wait for the standby to receive %s: %v", lsn, err)
	}
	if got := queryString(t, sconn, "SELECT coalesce(to_regclass('delayed')::text, 'none')"); got != "none" {
		t.Errorf("table delayed on the delayed standby = %s, want none", got)
	}
}

func TestStandbyOfTLSPrimary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	primary := startPostgres(t, servers.PostgresOptions{TLS: &files})
	standby := startStandby(t, ctx, primary, servers.StandbyOptions{Name: "tls_standby"})
	conn := connect(t, primary)
	mustExec(t, ctx, conn, "CREATE TABLE t AS SELECT 1 AS id")
	if err := standby.WaitCaughtUp(ctx); err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
	}
	if got := queryString(t, conn, "SELECT bool_and(s.ssl)::text FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) WHERE r.application_name = 'tls_standby'"); got != "true" {
		t.Errorf("the standby's replication connection uses TLS: %s, want true", got)
	}
	sconn := connect(t, standby)
	if got := queryString(t, sconn, "SELECT count(*)::text FROM t"); got != "1" {
		t.Errorf("rows on the standby = %s, want 1", got)
	}
}

// TestFailoverSlotSync checks, on PostgreSQL 17 and later, that a logical
// failover slot of the primary is synchronised to standbys, by the slot sync
// worker and by pg_sync_replication_slots(), and can be read after
// promotion. Earlier versions have no failover slots; there it checks that
// SetSynchronizedStandbySlots says so.
func TestFailoverSlotSync(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	primary := startPostgres(t, servers.PostgresOptions{})
	if primary.Major() < 17 {
		err := primary.SetSynchronizedStandbySlots(ctx, "x")
		if err == nil || !strings.Contains(err.Error(), "17") {
			t.Errorf("SetSynchronizedStandbySlots on PostgreSQL %d = %v, want an error naming 17", primary.Major(), err)
		}
		t.Logf("PostgreSQL %d has no failover slots; checked the refusal only", primary.Major())
		return
	}

	// manual syncs only when pg_sync_replication_slots() is called; worker
	// syncs by itself (sync_replication_slots = on, the default). worker is
	// made last, because making a standby restarts the primary, and a slot
	// sync worker that loses its connection is restarted only 10 s later.
	manual := startStandby(t, ctx, primary, servers.StandbyOptions{
		Name:     "manual",
		Settings: map[string]string{"sync_replication_slots": "off"},
	})
	worker := startStandby(t, ctx, primary, servers.StandbyOptions{Name: "worker"})
	if err := primary.SetSynchronizedStandbySlots(ctx, worker.StandbySlot(), manual.StandbySlot()); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, primary)
	mustExec(t, ctx, conn, "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
	mustExec(t, ctx, conn, "SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, false, true)")
	wconn := connect(t, worker)
	mconn := connect(t, manual)
	if got := queryString(t, wconn, "SHOW sync_replication_slots"); got != "on" {
		t.Errorf("sync_replication_slots on worker = %s, want on", got)
	}
	if got := queryString(t, mconn, "SHOW sync_replication_slots"); got != "off" {
		t.Errorf("sync_replication_slots on manual = %s, want off", got)
	}

	// A standby persists a synced slot only once it can build a consistent
	// snapshot between the slot's restart_lsn and its confirmed_flush_lsn,
	// and once the primary's catalog_xmin is not behind the one the standby
	// reserved (slotsync.c, update_and_persist_local_synced_slot). Each round
	// logs a running-xacts record on the primary, advances the slot past
	// it, and waits until both standbys have replayed it.
	synced := map[string]bool{}
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for round := 1; !synced["worker"] || !synced["manual"]; round++ {
		mustExec(t, ctx, conn, "SELECT pg_log_standby_snapshot()")
		mustExec(t, ctx, conn, "SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())")
		for _, s := range []*servers.Postgres{worker, manual} {
			if err := s.WaitCaughtUp(ctx); err != nil {
				t.Fatalf("round %d: WaitCaughtUp(%s): %v", round, s.StandbySlot(), err)
			}
		}
		if !synced["manual"] {
			if _, err := mconn.Exec(ctx, "SELECT pg_sync_replication_slots()"); err != nil {
				t.Fatalf("round %d: pg_sync_replication_slots(): %v", round, err)
			}
		}
		for name, c := range map[string]*pgx.Conn{"worker": wconn, "manual": mconn} {
			var ok bool
			err := c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = 's' AND synced AND failover AND NOT temporary)").Scan(&ok)
			if err != nil {
				t.Fatalf("round %d: read slots on %s: %v", round, name, err)
			}
			if ok && !synced[name] {
				t.Logf("slot s synced and persistent on %s after %d rounds", name, round)
			}
			synced[name] = synced[name] || ok
		}
		select {
		case <-ctx.Done():
			t.Fatalf("slot s not synced after %d rounds: %v (synced: %v)", round, ctx.Err(), synced)
		case <-ticker.C:
		}
	}

	// A change the slot has not confirmed yet is decoded on the promoted
	// standby: the slot survived the failover with its position.
	mustExec(t, ctx, conn, "INSERT INTO t VALUES (42)")
	if err := worker.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := worker.Promote(ctx); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	const peek = `SELECT count(*)::text FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL,
		'proto_version', '1', 'publication_names', 'p') WHERE get_byte(data, 0) = ascii('I')`
	if got := queryString(t, wconn, peek); got != "1" {
		t.Errorf("inserts decoded from slot s on the promoted standby = %s, want 1", got)
	}
}

// pollTrue runs a boolean query until it returns true or ctx is done.
func pollTrue(ctx context.Context, conn *pgx.Conn, sql string, args ...any) error {
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	for {
		var ok *bool
		if err := conn.QueryRow(ctx, sql, args...).Scan(&ok); err != nil {
			return err
		}
		if ok != nil && *ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
