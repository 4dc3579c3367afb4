package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestSetupSaysWhatSlotCreationWaitsFor runs walcount setup while an app
// transaction holds an xid: PostgreSQL's creation of the slot waits for it,
// and setup used to hang without a word. It must say what it waits for (the
// transaction's pid and age) and finish once that transaction ends.
func TestSetupSaysWhatSlotCreationWaitsFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, appSchema); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	var appPID int32
	if err := tx.QueryRow(ctx, "INSERT INTO likes (post_id) VALUES (3) RETURNING pg_backend_pid()").Scan(&appPID); err != nil {
		t.Fatal(err)
	}

	p := startWalcount(t, nil, "setup", "--database-url", pg.URL(), "--redis-url", testenv.RedisURL(t))
	want := fmt.Sprintf("waits for the oldest running transaction to end: pid %d", appPID)
	poll(t, "setup to say what the slot creation waits for", func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("setup ended while the transaction was open:\n%s", p.stderr.String())
		default:
		}
		return strings.Contains(p.stderr.String(), want), p.stderr.String()
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != exitOK {
		t.Fatalf("setup exited %d once the transaction ended, want 0", code)
	}
}
