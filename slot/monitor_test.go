package slot_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
	monitor "github.com/walcount/walcount/slot"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const mib = 1 << 20

func TestReadSlotLagGrowsAndShrinks(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	pool := connect(t, testenv.Database(t))
	slot := createSlot(t, pool)

	s0 := readSlot(t, pool, slot)
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if !s0.Exists || s0.Plugin != "pgoutput" || s0.SlotType != "logical" || s0.Database != db ||
		s0.Active || s0.ActivePID != 0 || s0.WALStatus != monitor.WALReserved || s0.Invalidated {
		t.Fatalf("fresh slot reads as %+v", s0)
	}
	if s0.RestartLSN == 0 || s0.RestartLSN > s0.ConfirmedFlushLSN || s0.ConfirmedFlushLSN > s0.CurrentLSN {
		t.Fatalf("want 0 < restart_lsn <= confirmed_flush_lsn <= current, got %s %s %s",
			s0.RestartLSN, s0.ConfirmedFlushLSN, s0.CurrentLSN)
	}
	if s0.LagBytes != int64(s0.CurrentLSN-s0.ConfirmedFlushLSN) || s0.RetainedWALBytes != int64(s0.CurrentLSN-s0.RestartLSN) {
		t.Fatalf("lag %d and retained %d do not match the LSNs %s %s %s",
			s0.LagBytes, s0.RetainedWALBytes, s0.RestartLSN, s0.ConfirmedFlushLSN, s0.CurrentLSN)
	}

	// A committed transaction's WAL is flushed at commit, so
	// pg_current_wal_lsn() (the WAL write position) moves past the message
	// and the slot's lag grows by at least its size.
	if _, err := pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'walcount-test', repeat('x', $1))`, mib); err != nil {
		t.Fatal(err)
	}
	s1 := readSlot(t, pool, slot)
	if s1.LagBytes < s0.LagBytes+mib {
		t.Fatalf("lag went from %d to %d after writing 1 MiB of WAL", s0.LagBytes, s1.LagBytes)
	}
	if s1.RetainedWALBytes < s1.LagBytes {
		t.Fatalf("retained %d < lag %d", s1.RetainedWALBytes, s1.LagBytes)
	}

	// Confirming up to the current position (as walcount's ack does)
	// takes the lag away.
	if _, err := pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, slot, s1.CurrentLSN.String()); err != nil {
		t.Fatal(err)
	}
	s2 := readSlot(t, pool, slot)
	if s2.ConfirmedFlushLSN < s1.CurrentLSN {
		t.Fatalf("confirmed_flush_lsn %s after advancing to %s", s2.ConfirmedFlushLSN, s1.CurrentLSN)
	}
	if s2.LagBytes >= s1.LagBytes {
		t.Fatalf("lag %d did not shrink from %d after advancing the slot", s2.LagBytes, s1.LagBytes)
	}
}

func TestReadSlotMissing(t *testing.T) {
	t.Parallel()
	pool := connect(t, testenv.Database(t))
	s := readSlot(t, pool, "walcount_no_such_slot")
	if s.Exists || s.CurrentLSN == 0 || s.Invalidated {
		t.Fatalf("missing slot reads as %+v", s)
	}
	if err := s.Err(); !errors.Is(err, monitor.ErrSlotNotFound) {
		t.Fatalf("Err() = %v, want ErrSlotNotFound", err)
	}
}

// TestReadSlotSpillStats decodes a transaction larger than
// logical_decoding_work_mem, which the server spills to disk, and checks that
// the spill statistics of pg_stat_replication_slots come through.
func TestReadSlotSpillStats(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	pool := connect(t, testenv.Database(t))
	for _, q := range []string{
		`CREATE TABLE spill (id int PRIMARY KEY, pad text)`,
		`CREATE PUBLICATION spill_pub FOR TABLE spill`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	slot := createSlot(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO spill SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// 64kB is the smallest allowed; the 5000-row transaction is ~1 MB.
	if _, err := conn.Exec(ctx, `SET logical_decoding_work_mem = '64kB'`); err != nil {
		t.Fatal(err)
	}
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'spill_pub')`, slot).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n < 5000 {
		t.Fatalf("decoded %d messages, want at least 5000", n)
	}

	// Decoding statistics reach the shared statistics asynchronously.
	s := eventually(t, pool, slot, "spill statistics", func(s monitor.SlotStatus) bool {
		return s.SpillTxns > 0 && s.SpillBytes > 0
	})
	t.Logf("spill_txns=%d spill_bytes=%d stream_txns=%d stream_bytes=%d", s.SpillTxns, s.SpillBytes, s.StreamTxns, s.StreamBytes)
}

// TestMonitorActiveSlotAndLag runs a Monitor while a replication connection
// streams from the slot without ever confirming anything, as a stuck
// walcount would: the slot is active, its lag grows past the maximum and
// LagOK says so. Lag is measured against the server's WAL position, which
// every database of a cluster moves, so the test has a server of its own:
// on the shared one, another test's WAL made the fresh slot lag.
func TestMonitorActiveSlotAndLag(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dbURL := testenv.Postgres(t).URL()
	pool := connect(t, dbURL)
	if _, err := pool.Exec(ctx, `CREATE PUBLICATION lag_pub FOR ALL TABLES`); err != nil {
		t.Fatal(err)
	}
	slot := createSlot(t, pool)

	repl := replicationConn(t, dbURL)
	err := pglogrepl.StartReplication(ctx, repl, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'lag_pub'"},
	})
	if err != nil {
		t.Fatalf("start replication: %v", err)
	}

	m := metrics.New()
	core, logs := observer.New(zapcore.InfoLevel)
	mon := monitor.New(monitor.Options{Querier: pool, Slot: slot, Interval: 50 * time.Millisecond, MaxLagBytes: mib, Metrics: m, Logger: zap.New(core)})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mon.Run(runCtx) }()

	s := waitLatest(t, mon, "an active slot", func(s monitor.SlotStatus) bool { return s.Active })
	if s.ActivePID != int(repl.PID()) {
		t.Errorf("active_pid = %d, want the walsender's %d", s.ActivePID, repl.PID())
	}
	if v := value(t, m.SlotActive); v != 1 {
		t.Errorf("walcount_slot_active = %v, want 1", v)
	}
	if v := value(t, m.SlotWALStatus.WithLabelValues("reserved")); v != 1 {
		t.Errorf("walcount_slot_wal_status{status=reserved} = %v, want 1", v)
	}
	if err := mon.LagOK(); err != nil {
		t.Errorf("LagOK with a fresh slot = %v, want nil", err)
	}

	if _, err := pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'walcount-test', repeat('x', $1))`, 2*mib); err != nil {
		t.Fatal(err)
	}
	waitLatest(t, mon, "lag above 1 MiB", func(s monitor.SlotStatus) bool { return s.LagBytes > mib })
	if err := mon.LagOK(); !errors.Is(err, monitor.ErrLagTooHigh) {
		t.Errorf("LagOK with a 2 MiB lag = %v, want ErrLagTooHigh", err)
	}
	if v := value(t, m.SlotLagBytes); v <= mib {
		t.Errorf("walcount_slot_lag_bytes = %v, want more than 1 MiB", v)
	}
	if v := value(t, m.SlotRetainedWALBytes); v <= mib {
		t.Errorf("walcount_slot_retained_wal_bytes = %v, want more than 1 MiB", v)
	}
	if n := logs.FilterMessageSnippet("lag above the maximum").Len(); n != 1 {
		t.Errorf("lag warning logged %d times, want once: %v", n, logs.All())
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

// TestMonitorStopsOnLostSlot makes the server remove WAL that a slot still
// needs, the way a full disk's safety valve would in production: with
// max_slot_wal_keep_size at 1MB, one WAL segment switch and a CHECKPOINT
// invalidate an idle slot. Run must then return a *SlotLostError.
func TestMonitorStopsOnLostSlot(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	began := time.Now()
	pg := testenv.Postgres(t)

	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	keep, err := monitor.ReadMaxSlotWALKeepSize(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if keep != -1 {
		t.Fatalf("default max_slot_wal_keep_size = %d, want -1 (unlimited)", keep)
	}

	if err := pg.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if err := pg.SetSettings(ctx, map[string]string{"max_slot_wal_keep_size": "1MB"}); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pool := connect(t, pg.URL())
	if keep, err := monitor.ReadMaxSlotWALKeepSize(ctx, pool); err != nil || keep != mib {
		t.Fatalf("max_slot_wal_keep_size = %d, %v; want 1 MiB", keep, err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('walcount', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}

	m := metrics.New()
	core, logs := observer.New(zapcore.InfoLevel)
	mon := monitor.New(monitor.Options{Querier: pool, Slot: "walcount", Interval: 50 * time.Millisecond, Metrics: m, Logger: zap.New(core)})
	done := make(chan error, 1)
	go func() { done <- mon.Run(ctx) }()

	s := waitLatest(t, mon, "the new slot", func(s monitor.SlotStatus) bool { return s.Exists })
	if s.WALStatus != monitor.WALReserved || s.SafeWALSizeBytes == nil || *s.SafeWALSizeBytes <= 0 {
		t.Fatalf("new slot: wal_status=%q safe_wal_size=%v, want reserved and a positive limit", s.WALStatus, s.SafeWALSizeBytes)
	}
	t.Logf("new slot: safe_wal_size=%d", *s.SafeWALSizeBytes)

	// Each round moves the server to a new 16 MB WAL segment (a switch
	// needs some WAL since the last one) and checkpoints, which removes
	// every segment beyond max_slot_wal_keep_size and invalidates the slot.
	var runErr error
rounds:
	for round := 1; ; round++ {
		for _, q := range []string{
			`SELECT pg_logical_emit_message(false, 'walcount-test', 'x')`,
			`SELECT pg_switch_wal()`,
			`CHECKPOINT`,
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatalf("round %d: %s: %v", round, q, err)
			}
		}
		select {
		case runErr = <-done:
			t.Logf("slot lost after %d round(s)", round)
			break rounds
		case <-time.After(2 * time.Second):
			if round == 10 {
				t.Fatalf("slot not lost after %d rounds; last reading %+v", round, latest(mon))
			}
		}
	}

	var lost *monitor.SlotLostError
	if !errors.As(runErr, &lost) || !errors.Is(runErr, monitor.ErrSlotLost) {
		t.Fatalf("Run = %v, want a *SlotLostError", runErr)
	}
	if lost.Slot != "walcount" || lost.WALStatus != monitor.WALLost {
		t.Errorf("SlotLostError = %+v, want slot walcount, wal_status lost", *lost)
	}
	for _, want := range []string{`replication slot "walcount" is lost (wal_status=lost)`, "walcount setup --recreate-slot", "on_slot_loss: recreate"} {
		if !strings.Contains(runErr.Error(), want) {
			t.Errorf("error %q does not say %q", runErr, want)
		}
	}

	s = latest(mon)
	if !s.Invalidated || s.SafeWALSizeBytes != nil {
		t.Errorf("lost slot reads as %+v, want invalidated with no safe WAL size", s)
	}
	if err := mon.LagOK(); !errors.Is(err, monitor.ErrSlotLost) {
		t.Errorf("LagOK on a lost slot = %v, want ErrSlotLost", err)
	}
	for _, status := range []string{"reserved", "extended", "unreserved", "lost"} {
		want := 0.0
		if status == "lost" {
			want = 1
		}
		if v := value(t, m.SlotWALStatus.WithLabelValues(status)); v != want {
			t.Errorf("walcount_slot_wal_status{status=%q} = %v, want %v", status, v, want)
		}
	}
	if v := value(t, m.SlotSafeWALSizeBytes); v != -1 {
		t.Errorf("walcount_slot_safe_wal_size_bytes = %v, want -1", v)
	}
	if v := value(t, m.SlotInvalidated.WithLabelValues(monitor.ReasonWALRemoved)); v != 1 {
		t.Errorf(`walcount_slot_invalidated{reason="wal_removed"} = %v, want 1`, v)
	}
	if n := logs.FilterMessage("replication slot lost").FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Errorf("logged the lost slot %d times at error level, want once: %v", n, logs.All())
	}
	t.Logf("lost-slot test took %s including the cluster", time.Since(began).Round(time.Millisecond))
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func replicationConn(t *testing.T, url string) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(ctx) // only the test's connection; the server side ends with it
	})
	return conn
}

// createSlot creates a logical slot with a unique name and drops it at the
// end of the test: slots are cluster-wide, and a forgotten one would pin the
// shared cluster's WAL for every later test.
func createSlot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "walcount_monitor_" + hex.EncodeToString(b[:])
	if _, err := pool.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name); err != nil {
		t.Fatalf("create slot: %v", err)
	}
	t.Cleanup(func() {
		// The slot may still be active for a moment after its
		// replication connection closed; wait for the walsender to exit.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if !wait.Until(10*time.Second, 50*time.Millisecond, func() bool {
			_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
			return err == nil
		}) {
			t.Errorf("drop slot %s: %v", name, err)
		}
	})
	return name
}

func readSlot(t *testing.T, q monitor.Querier, slot string) monitor.SlotStatus {
	t.Helper()
	s, err := monitor.ReadSlot(context.Background(), q, slot)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// eventually reads the slot until ok holds, for at most 10 seconds.
func eventually(t *testing.T, q monitor.Querier, slot, what string, ok func(monitor.SlotStatus) bool) monitor.SlotStatus {
	t.Helper()
	var s monitor.SlotStatus
	if !wait.Until(10*time.Second, 50*time.Millisecond, func() bool {
		s = readSlot(t, q, slot)
		return ok(s)
	}) {
		t.Fatalf("gave up waiting for %s; last reading %+v", what, s)
	}
	return s
}

// waitLatest waits, for at most 10 seconds, until the monitor's latest
// reading satisfies ok.
func waitLatest(t *testing.T, mon *monitor.Monitor, what string, ok func(monitor.SlotStatus) bool) monitor.SlotStatus {
	t.Helper()
	var s monitor.SlotStatus
	if !wait.Until(10*time.Second, 20*time.Millisecond, func() bool {
		var have bool
		s, have = mon.Latest()
		return have && ok(s)
	}) {
		t.Fatalf("gave up waiting for the monitor to see %s; last reading %+v", what, latest(mon))
	}
	return s
}

func latest(mon *monitor.Monitor) monitor.SlotStatus {
	s, _ := mon.Latest()
	return s
}

// value reads a gauge or counter.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
