package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// These tests run walcount status and walcount run against real, private
// PostgreSQL and Redis servers. They assert no durations: waits poll under
// generous deadlines.

const within = 90 * time.Second

var appSchema = appschema.SQL(appschema.Options{Posts: 20})

// cluster is a private PostgreSQL and Redis with the app's tables and
// walcount set up (slot, publication, checkpoint).
type cluster struct {
	pg  *servers.Postgres
	cfg config.Config
}

func newCluster(t *testing.T, pgSettings map[string]string) *cluster {
	t.Helper()
	c := &cluster{pg: testenv.Postgres(t, servers.PostgresOptions{Settings: pgSettings})}
	rd := testenv.Redis(t)
	c.cfg = config.Default()
	c.cfg.DatabaseURL = c.pg.URL()
	c.cfg.RedisURL = rd.URL()
	c.cfg.HTTPAddr = "" // never the default port: no daemon is asked unless a test says so
	c.cfg.FlushInterval = 100 * time.Millisecond
	c.cfg.HeartbeatInterval = 200 * time.Millisecond
	c.cfg.SlotSettings.PollInterval = 200 * time.Millisecond
	c.exec(t, appSchema)
	conn := c.connect(t)
	if _, err := setup.Run(context.Background(), conn, setup.Options{Config: c.cfg}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c
}

func (c *cluster) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.pg.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func (c *cluster) exec(t *testing.T, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.pg.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// like inserts n likes in one transaction.
func (c *cluster) like(t *testing.T, n int) {
	t.Helper()
	c.exec(t, fmt.Sprintf("INSERT INTO likes (post_id) SELECT 1 + g %% 20 FROM generate_series(1, %d) g", n))
}

// status runs walcount status and returns its output. It also checks the
// exit status: 1 exactly when the report carries a warning.
func status(t *testing.T, cfg config.Config, asJSON bool) string {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := runStatus(ctx, &out, cfg, asJSON)
	var ec exitCodeError
	if err != nil && !errors.As(err, &ec) {
		t.Fatalf("walcount status: %v", err)
	}
	warned := strings.Contains(out.String(), "WARNING: ")
	if asJSON {
		warned = strings.Contains(out.String(), `"warnings"`)
	}
	if code := exitCode(err); code != map[bool]int{true: exitFailure, false: exitOK}[warned] {
		t.Errorf("walcount status exits %d with warnings %v; want 1 exactly when it warns:\n%s", code, warned, out.String())
	}
	return out.String()
}

// statusJSON is the part of walcount status --json the tests read.
type statusJSON struct {
	Slot struct {
		Exists    bool   `json:"exists"`
		Active    bool   `json:"active"`
		WALStatus string `json:"wal_status"`
		LagBytes  int64  `json:"lag_bytes"`
		Retained  int64  `json:"retained_wal_bytes"`
	} `json:"slot"`
	Checkpoint    string                `json:"checkpoint_lsn"`
	CheckpointAge *float64              `json:"checkpoint_age_seconds"`
	Carried       *state.CarriedSummary `json:"carried"`
	Daemon        *struct {
		Streaming bool   `json:"streaming"`
		Received  string `json:"received_lsn"`
	} `json:"daemon"`
	DaemonError string   `json:"daemon_error"`
	Warnings    []string `json:"warnings"`
}

func statusParsed(t *testing.T, cfg config.Config) statusJSON {
	t.Helper()
	out := status(t, cfg, true)
	var s statusJSON
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("walcount status --json is not JSON: %v\n%s", err, out)
	}
	return s
}

// TestStatusInactiveLaggingSlot runs walcount status with no daemon while
// likes keep coming: the slot is inactive, its lag grows, and both outputs
// say so in words. The database URL carries a password, which must not be
// printed.
func TestStatusInactiveLaggingSlot(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-pw"
	c := newCluster(t, nil)
	c.exec(t, "CREATE ROLE walcount_pw LOGIN REPLICATION SUPERUSER PASSWORD '"+secret+"'")
	u, err := url.Parse(c.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("walcount_pw", secret)
	cfg := c.cfg
	cfg.DatabaseURL = u.String()

	c.like(t, 100)
	first := statusParsed(t, cfg)
	c.like(t, 1000)
	second := statusParsed(t, cfg)
	if !second.Slot.Exists || second.Slot.Active || second.Slot.WALStatus != slot.WALReserved {
		t.Errorf("slot in --json = %+v, want an existing, inactive, reserved slot", second.Slot)
	}
	if first.Slot.LagBytes <= 0 || second.Slot.LagBytes <= first.Slot.LagBytes || second.Slot.Retained < second.Slot.LagBytes {
		t.Errorf("lag %d then %d (retained %d): want a positive lag that grows with the writes, within the retained WAL",
			first.Slot.LagBytes, second.Slot.LagBytes, second.Slot.Retained)
	}
	if second.Checkpoint == "" || second.CheckpointAge == nil || *second.CheckpointAge < 0 {
		t.Errorf("checkpoint in --json: %q, age %v", second.Checkpoint, second.CheckpointAge)
	}
	if len(second.Warnings) != 1 || !strings.Contains(second.Warnings[0], "INACTIVE") {
		t.Errorf("--json warnings = %q, want the INACTIVE warning", second.Warnings)
	}
	if second.Daemon != nil || second.DaemonError != "" {
		t.Errorf("--json asked a daemon with no --http-addr: %+v %q", second.Daemon, second.DaemonError)
	}

	out := status(t, cfg, false)
	t.Logf("walcount status:\n%s", out)
	for _, want := range []string{
		"state inactive",
		"wal_status reserved (the slot's WAL is within max_wal_size)",
		"safe_wal_size unlimited (max_slot_wal_keep_size = -1)",
		"checkpoint (W)",
		"buffer empty (no walcount keys in redis)",
		"WARNING: the slot is INACTIVE: no walcount is streaming from it or connected to the database; it holds back",
		"keeps growing while writes continue; start walcount run",
	} {
		if !says(out, want) {
			t.Errorf("walcount status does not say %q", want)
		}
	}
	for _, o := range []string{out, status(t, cfg, true)} {
		if strings.Contains(o, "teardown") {
			t.Errorf("walcount status suggests a teardown on a guess (an inactive slot):\n%s", o)
		}
		if strings.Contains(o, secret) {
			t.Errorf("walcount status prints the password:\n%s", o)
		}
	}
}

// TestStatusWithDaemon runs walcount status next to a running daemon
// served as walcount run serves it: the slot is active, the daemon's view is
// added, and nothing is flagged. Once the daemon stops, status says that no
// daemon answers.
func TestStatusWithDaemon(t *testing.T) {
	t.Parallel()
	c := newCluster(t, nil)
	d, err := daemon.New(daemon.Options{Config: c.cfg, RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon Run: %v", err)
			}
		case <-time.After(within):
			t.Error("the daemon did not stop")
		}
	}
	defer d.Close()
	srv := httpapi.New(httpapi.Options{
		Addr:   "127.0.0.1:0",
		Status: func(ctx context.Context) any { return d.Status(ctx) },
		Ready:  d.Ready,
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	closeSrv := func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := srv.Close(sctx); err != nil {
			t.Errorf("close http server: %v", err)
		}
	}
	cfg := c.cfg
	cfg.HTTPAddr = srv.Addr()

	c.like(t, 50)
	var s statusJSON
	poll(t, "status to show an active slot and a streaming daemon", func() (bool, string) {
		s = statusParsed(t, cfg)
		return s.Slot.Active && s.Daemon != nil && s.Daemon.Streaming && s.Daemon.Received != "",
			fmt.Sprintf("%+v", s)
	})
	if len(s.Warnings) != 0 {
		t.Errorf("warnings with a streaming daemon: %q", s.Warnings)
	}
	out := status(t, cfg, false)
	t.Logf("walcount status:\n%s", out)
	for _, want := range []string{"state active (pid ", "daemon streaming, received up to "} {
		if !says(out, want) {
			t.Errorf("walcount status does not say %q", want)
		}
	}
	if strings.Contains(out, "WARNING") {
		t.Errorf("walcount status warns with a streaming daemon")
	}

	closeSrv()
	stop()
	out = status(t, cfg, false)
	if !strings.Contains(out, "no daemon answers at "+cfg.HTTPAddr) {
		t.Errorf("walcount status with the daemon gone does not say that no daemon answers:\n%s", out)
	}
}

// TestRunStopsOnLostSlot loses the slot while no walcount runs and then
// starts walcount run: with the preflight checks it refuses to start, and
// without them the daemon stops at once; either way the error says what to
// do, and walcount status says the slot is lost.
func TestRunStopsOnLostSlot(t *testing.T) {
	t.Parallel()
	c := newCluster(t, map[string]string{"max_slot_wal_keep_size": "1MB"})
	conn := c.connect(t)
	ctx := context.Background()
	for round := 1; ; round++ {
		c.like(t, 100)
		for _, q := range []string{"SELECT pg_switch_wal()", "CHECKPOINT"} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		st, err := slot.ReadSlot(ctx, conn, c.cfg.Slot)
		if err != nil {
			t.Fatal(err)
		}
		if st.Invalidated {
			t.Logf("slot lost after %d round(s)", round)
			break
		}
		if round == 20 {
			t.Fatalf("slot not lost after %d rounds: %+v", round, st)
		}
	}

	cfg := c.cfg
	cfg.HTTPAddr = "127.0.0.1:0" // the HTTP server is wired as in production, on a free port
	const todo = "walcount setup --recreate-slot"

	err := runWithin(t, cfg, zap.NewNop(), false)
	if err == nil || !strings.Contains(err.Error(), todo) || !strings.Contains(err.Error(), "is lost") {
		t.Errorf("walcount run with the preflight checks = %v, want a refusal that says the slot is lost and %q", err, todo)
	}
	t.Logf("walcount run: %v", err)

	core, logs := observer.New(zapcore.InfoLevel)
	err = runWithin(t, cfg, zap.New(core), true)
	if !errors.Is(err, slot.ErrSlotLost) {
		t.Fatalf("walcount run --skip-check = %v, want an error wrapping slot.ErrSlotLost", err)
	}
	for _, want := range []string{todo, "on_slot_loss: recreate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("walcount run --skip-check error %q does not say %q", err, want)
		}
	}
	if code := exitCode(err); code != exitFailure {
		t.Errorf("exit code %d, want %d", code, exitFailure)
	}
	if n := logs.FilterMessage("stopping: the replication slot is lost").FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Errorf("logged the stop %d times, want once: %v", n, logs.All())
	}
	t.Logf("walcount run --skip-check: %v", err)

	cfg.HTTPAddr = ""
	out := status(t, cfg, false)
	t.Logf("walcount status:\n%s", out)
	for _, want := range []string{"wal_status lost (WAL the slot needed was removed)", "safe_wal_size none: the slot is lost", "retained WAL none (restart_lsn is NULL)",
		`WARNING: replication slot "walcount" is lost`, todo} {
		if !says(out, want) {
			t.Errorf("walcount status on a lost slot does not say %q", want)
		}
	}
}

// runWithin runs walcount run and returns its error; it fails the test if
// the command does not return by itself.
func runWithin(t *testing.T, cfg config.Config, log *zap.Logger, skipCheck bool) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runDaemon(ctx, cfg, log, skipCheck) }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		cancel()
		<-done
		t.Fatalf("walcount run did not stop by itself within %s", within)
		return nil
	}
}

// says reports whether out contains want, with every run of blanks in out
// (the table's alignment) read as one space.
func says(out, want string) bool {
	return strings.Contains(strings.Join(strings.FieldsFunc(out, func(r rune) bool { return r == ' ' || r == '\t' }), " "), want)
}

func poll(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	if !wait.Until(within, 100*time.Millisecond, func() bool {
		var ok bool
		ok, last = cond()
		return ok
	}) {
		t.Fatalf("timed out after %s waiting for %s; last: %s", within, what, last)
	}
}

// TestStatusShowsDirtyCounters: a counter marked dirty (here by hand, as
// a recreated slot would) is a line of its own and a warning, with the
// cause, whether or not a daemon runs; the status exits 1 until the mark
// is gone.
func TestStatusShowsDirtyCounters(t *testing.T) {
	t.Parallel()
	c := newCluster(t, nil)
	conn := c.connect(t)
	ctx := context.Background()
	if err := state.MarkDirty(ctx, conn, c.cfg.Slot, "post_likes", []string{"3", "4"}, "test: two keys"); err != nil {
		t.Fatal(err)
	}
	if err := state.MarkDirty(ctx, conn, c.cfg.Slot, "post_likes", nil, "test: the slot was recreated"); err != nil {
		t.Fatal(err)
	}
	out := status(t, c.cfg, false)
	for _, want := range []string{
		"dirty           post_likes: the whole counter, since ",
		"WARNING: counter post_likes is DIRTY (test: two keys)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	s := statusParsed(t, c.cfg)
	if len(s.Warnings) == 0 {
		t.Errorf("status --json has no warning for the dirty counter")
	}
	c.exec(t, "DELETE FROM walcount.dirty")
	if out := status(t, c.cfg, false); strings.Contains(out, "dirty") {
		t.Errorf("status still shows a dirty counter after the marks went:\n%s", out)
	}
}

// TestRunRecreatesMissingSlot: with on_slot_loss: recreate, walcount run
// (preflight included) starts on a database whose slot is gone, as after a
// failover to a server without it, recreates the slot and repairs the
// counters by itself.
func TestRunRecreatesMissingSlot(t *testing.T) {
	t.Parallel()
	c := newCluster(t, nil)
	c.like(t, 50)
	c.exec(t, "SELECT pg_drop_replication_slot('walcount')")
	c.like(t, 30) // never decoded: only a repair counts them
	cfg := c.cfg
	cfg.OnSlotLoss = config.SlotLossRecreate
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	var runErr error
	go func() { defer close(stopped); runErr = runDaemon(ctx, cfg, zap.NewNop(), false) }()
	defer func() {
		cancel()
		<-stopped
		if runErr != nil {
			t.Errorf("walcount run: %v", runErr)
		}
	}()
	conn := c.connect(t)
	poll(t, "the counts repaired", func() (bool, string) {
		var off, marks int
		var active bool
		err := conn.QueryRow(context.Background(), `
SELECT (SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)),
       (SELECT count(*) FROM walcount.dirty),
       coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = 'walcount'), false)`).Scan(&off, &marks, &active)
		select {
		case <-stopped:
			t.Fatalf("walcount run stopped: %v", runErr)
		default:
		}
		return err == nil && off == 0 && marks == 0 && active, fmt.Sprintf("%d posts off, %d dirty marks, slot active %v, err %v", off, marks, active, err)
	})
}

// TestStatusShowsCarriedKeys: a key carried for minutes (its row held by
// the app) and a parked key are lines of their own, each named, and
// warnings; the status exits 1 while they last.
func TestStatusShowsCarriedKeys(t *testing.T) {
	t.Parallel()
	c := newCluster(t, nil)
	conn := c.connect(t)
	ctx := context.Background()
	err := state.SaveCarried(ctx, conn, c.cfg.Slot, []state.Carried{
		{Counter: "post_likes", Key: "7", Delta: 12, Since: time.Now().Add(-5 * time.Minute)},
		{Counter: "post_likes", Key: "9", Delta: 1},
		{Counter: "post_likes", Key: "50", Delta: -1, Parked: "post 50 is archived and read-only (SQLSTATE P0001)"},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out := status(t, c.cfg, false)
	for _, want := range []string{
		"carried         2 keys whose row is locked by another transaction; oldest post_likes key 7 (delta +12) for 5m",
		"parked          post_likes key 50 (delta -1), since ",
		"WARNING: counter post_likes key 7 has been carried for 5m",
		"WARNING: counter post_likes key 50 is PARKED: its update fails (post 50 is archived and read-only (SQLSTATE P0001))",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	s := statusParsed(t, c.cfg)
	if s.Carried == nil || s.Carried.Deferred != 2 || s.Carried.Parked != 1 {
		t.Errorf("status --json carried = %+v", s.Carried)
	}
	c.exec(t, "DELETE FROM walcount.carried")
	if out := status(t, c.cfg, false); strings.Contains(out, "carried") || strings.Contains(out, "parked") {
		t.Errorf("status still shows carried keys after they went:\n%s", out)
	}
}
