package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// TestRunStopsCleanlyOnSIGTERM runs the real binary: after SIGTERM it
// flushes, confirms W to the slot and exits 0.
func TestRunStopsCleanlyOnSIGTERM(t *testing.T) {
	t.Parallel()
	bin := walcountBinary(t)
	ctx := context.Background()
	dbURL, redisURL := testenv.Database(t), testenv.RedisURL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, appschema.SQL(appschema.Options{Posts: 10})); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "WALCOUNT_DATABASE_URL="+dbURL, "WALCOUNT_REDIS_URL="+redisURL)
	// Slots are cluster-wide and the cluster is shared: a slot of its own.
	slot := fmt.Sprintf("signal_%d", os.Getpid())
	setupCmd := exec.Command(bin, "setup", "--slot", slot)
	setupCmd.Env = env
	if out, err := setupCmd.CombinedOutput(); err != nil {
		t.Fatalf("setup: %v\n%s", err, out)
	}
	var logs bytes.Buffer
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	run := exec.Command(bin, "run", "--slot", slot, "--http-addr", addr, "--flush-interval", "200ms")
	run.Env = env
	run.Stderr = &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()

	if _, err := conn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 10 FROM generate_series(1, 500) g`); err != nil {
		t.Fatal(err)
	}
	var total int64
	if !wait.Until(time.Minute, 50*time.Millisecond, func() bool {
		if err := conn.QueryRow(ctx, `SELECT sum(likes_count) FROM posts`).Scan(&total); err != nil {
			t.Fatal(err)
		}
		return total == 500
	}) {
		t.Fatalf("counts never reached 500 (at %d); logs:\n%s", total, logs.String())
	}
	// Likes right before the signal are flushed by the shutdown.
	if _, err := conn.Exec(ctx, `INSERT INTO likes (post_id) VALUES (1), (2), (3)`); err != nil {
		t.Fatal(err)
	}
	// Wait until the daemon received them, so the test is about the
	// shutdown flush, not about delivery.
	var end string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	want, _ := pglogrepl.ParseLSN(end)
	if !wait.Until(time.Minute, 20*time.Millisecond, func() bool {
		raw, err := fetchDaemonStatus(ctx, addr)
		var st struct {
			Received string `json:"received_lsn"`
		}
		if err == nil && json.Unmarshal(raw, &st) == nil {
			if got, err := pglogrepl.ParseLSN(st.Received); err == nil && got >= want {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the daemon never received the last likes; logs:\n%s", logs.String())
	}
	// cpu_scheduling defaults to batch.
	checkBatchThreads(t, run.Process.Pid)
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("walcount run exited with %v after SIGTERM; logs:\n%s", err, logs.String())
		}
	case <-time.After(time.Minute):
		_ = run.Process.Kill()
		t.Fatalf("walcount run did not exit after SIGTERM; logs:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "stopped cleanly") {
		t.Errorf("no clean-stop line in the logs:\n%s", logs.String())
	}
	var behind bool
	var confirmed, w string
	if err := conn.QueryRow(ctx, `SELECT s.confirmed_flush_lsn < c.lsn, s.confirmed_flush_lsn::text, c.lsn::text FROM pg_replication_slots s, walcount.checkpoint c
WHERE s.slot_name = $1 AND c.slot_name = $1`, slot).Scan(&behind, &confirmed, &w); err != nil {
		t.Fatal(err)
	}
	if behind {
		t.Errorf("slot confirmed %s, checkpoint %s: the final ack must reach W", confirmed, w)
	}
	if err := conn.QueryRow(ctx, `SELECT sum(likes_count) FROM posts`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 503 {
		t.Errorf("sum of likes_count after shutdown = %d, want 503: the shutdown flush lost likes; logs:\n%s", total, logs.String())
	}
}
