package slot_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/internal/testkit/testenv"
	monitor "github.com/walcount/walcount/slot"
)

// TestMonitorNamesIdleTimeout: on PostgreSQL 18 a slot without a reader for
// longer than idle_replication_slot_timeout is invalidated at the next
// checkpoint. The monitor must stop with an error that names the cause, and
// the metric must carry it, so that the alert says why. On older versions
// the setting must not exist, which is what pgversion's gate says.
func TestMonitorNamesIdleTimeout(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	pg := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	v, err := pgversion.Read(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	_, showErr := conn.Exec(ctx, "SHOW idle_replication_slot_timeout")
	conn.Close(ctx)
	if v.IdleSlotTimeout() != (showErr == nil) {
		t.Fatalf("PostgreSQL %s: IdleSlotTimeout() = %v but SHOW idle_replication_slot_timeout says %v", v, v.IdleSlotTimeout(), showErr)
	}
	if !v.IdleSlotTimeout() {
		t.Logf("PostgreSQL %s has no idle_replication_slot_timeout; nothing more to check", v)
		return
	}

	if err := pg.SetSettings(ctx, map[string]string{"idle_replication_slot_timeout": "1s"}); err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pool := connect(t, pg.URL())
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('walcount', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	mon := monitor.New(monitor.Options{Querier: pool, Slot: "walcount", Interval: 50 * time.Millisecond, Metrics: m})
	done := make(chan error, 1)
	go func() { done <- mon.Run(ctx) }()
	s := waitLatest(t, mon, "the new slot", func(s monitor.SlotStatus) bool { return s.Exists })
	if s.Active || s.InactiveSince == nil {
		t.Fatalf("new slot reads as %+v, want inactive with inactive_since set", s)
	}

	// The timeout is checked at checkpoints: checkpoint until the slot,
	// idle for more than a second, is invalidated.
	var runErr error
	for deadline := time.Now().Add(time.Minute); runErr == nil; {
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		select {
		case runErr = <-done:
		case <-time.After(500 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("slot not invalidated within a minute; last reading %+v", latest(mon))
			}
		}
	}
	var lost *monitor.SlotLostError
	if !errors.As(runErr, &lost) || lost.Reason != monitor.ReasonIdleTimeout {
		t.Fatalf("Run = %v, want a *SlotLostError with reason idle_timeout", runErr)
	}
	if !strings.Contains(runErr.Error(), "idle_replication_slot_timeout") {
		t.Errorf("error %q does not name idle_replication_slot_timeout", runErr)
	}
	if got := value(t, m.SlotInvalidated.WithLabelValues(monitor.ReasonIdleTimeout)); got != 1 {
		t.Errorf(`walcount_slot_invalidated{reason="idle_timeout"} = %v, want 1`, got)
	}
}
