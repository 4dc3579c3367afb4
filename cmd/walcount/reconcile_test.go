package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/config"
	"github.com/walcount/walcount/internal/daemon"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/setup"
	"github.com/walcount/walcount/internal/testenv"
	"github.com/walcount/walcount/reconcile"
)

func TestReconcileCommandNoDaemon(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := runReconcile(context.Background(), &out, "http://127.0.0.1:1", reconcile.Request{})
	if err == nil || !strings.Contains(err.Error(), "walcount run") {
		t.Fatalf("err = %v; want a message saying how to start the daemon", err)
	}
}

func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.Database(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `
CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL);
ALTER TABLE likes REPLICA IDENTITY FULL;
INSERT INTO posts (id) SELECT g FROM generate_series(1, 30) g;`); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.RedisURL = dbURL, testenv.RedisURL(t)
	// Slots are cluster-wide and the cluster is shared: a slot of its own.
	cfg.Slot = fmt.Sprintf("reconcile_cmd_%d", os.Getpid())
	cfg.FlushInterval = 100 * time.Millisecond
	if _, err := setup.Run(ctx, conn, setup.Options{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() { cancel(); <-done; d.Close() }()
	srv := httpapi.New(httpapi.Options{Addr: "127.0.0.1:0", Status: func(ctx context.Context) any { return d.Status(ctx) }, Ready: d.Ready, Reconcile: d.ReconcileHandler()})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(ctx)

	// Let the daemon's automatic backfill of the new counter finish
	// before drift is injected, or the backfill corrects it first.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if st := d.ReconcileStatus(); st.Current == nil && st.Last != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("backfill did not finish")
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 30 FROM generate_series(1, 300) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 4 WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr()
	var out bytes.Buffer
	if err := runReconcile(ctx, &out, base, reconcile.Request{DryRun: true}); err != nil {
		t.Fatalf("dry run: %v\n%s", err, out.String())
	}
	text := out.String()
	if !strings.Contains(text, "key 3 cached") || !strings.Contains(text, "30 keys checked, 1 drifted, 1 would correct (dry run)") {
		t.Fatalf("dry run output:\n%s", text)
	}
	out.Reset()
	if err := runReconcile(ctx, &out, base, reconcile.Request{}); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "1 drifted, 1 corrected") {
		t.Fatalf("reconcile output:\n%s", out.String())
	}
	var off int
	waitUntil := time.Now().Add(30 * time.Second)
	for time.Now().Before(waitUntil) {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes WHERE post_id = p.id)`).Scan(&off); err != nil {
			t.Fatal(err)
		}
		if off == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%d posts still off after the reconciliation", off)
}
