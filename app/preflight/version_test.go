package preflight_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// TestVersionDependentChecks runs the checks whose SQL depends on the
// server's version on whatever version the tests run against
// (WALCOUNT_TEST_PG): the role's right to pg_logical_emit_message, whose
// signature grew a fourth argument in 17, and on 18 the warning about
// idle_replication_slot_timeout, which invalidates a slot that has had no
// reader for that long.
func TestVersionDependentChecks(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	v, err := pgversion.Read(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := fixtureOn(t, pg.URL(), goodSchema)
	f.setUp(t)
	findings := run(t, f.cfg)
	want(t, findings, preflight.CheckEmitMessage, preflight.OK, "may call pg_logical_emit_message")
	if !v.IdleSlotTimeout() {
		for _, fd := range findings {
			if fd.Check == preflight.CheckIdleSlotTimeout {
				t.Fatalf("PostgreSQL %s has no idle_replication_slot_timeout, yet: %+v", v, fd)
			}
		}
		return
	}
	want(t, findings, preflight.CheckIdleSlotTimeout, preflight.OK, "idle_replication_slot_timeout is 0")

	// A timeout set while walcount is stopped: the warning says how long
	// the inactive slot has left, and how to turn the timeout off.
	f.exec(t, "ALTER SYSTEM SET idle_replication_slot_timeout = '1h'")
	f.exec(t, "SELECT pg_reload_conf()")
	var got string
	if !wait.Until(30*time.Second, 20*time.Millisecond, func() bool {
		if err = f.conn.QueryRow(ctx, "SHOW idle_replication_slot_timeout").Scan(&got); err != nil {
			t.Fatalf("idle_replication_slot_timeout = %q, %v; want 1h after the reload", got, err)
		}
		return got == "1h"
	}) {
		t.Fatalf("idle_replication_slot_timeout = %q, %v; want 1h after the reload", got, err)
	}
	findings = run(t, f.cfg)
	w := want(t, findings, preflight.CheckIdleSlotTimeout, preflight.Warning, "idle_replication_slot_timeout is 1h0m0s")
	if !strings.Contains(w.Message, "start walcount within") || !strings.Contains(w.Fix, "idle_replication_slot_timeout = 0") {
		t.Errorf("warning %+v does not give the time left and the fix", w)
	}
	if preflight.Gate(findings) != nil {
		t.Error("a warning refuses to start")
	}
}
