package sink

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// fakeServer answers the gate's three queries: synchronized_standby_slots,
// the insert position, and the standbys' least restart_lsn (NULL unless
// every named slot exists).
type fakeServer struct {
	mu      sync.Mutex
	setting string
	insert  cdc.LSN
	restart map[string]cdc.LSN
}

type fakeRow struct {
	vals []any
	err  error
}

func (r fakeRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	for i, d := range dest {
		switch d := d.(type) {
		case *string:
			*d = r.vals[i].(string)
		case *cdc.LSN:
			*d = r.vals[i].(cdc.LSN)
		case **cdc.LSN:
			if v, ok := r.vals[i].(cdc.LSN); ok {
				*d = &v
			} else {
				*d = nil
			}
		default:
			return fmt.Errorf("fake: cannot scan into %T", d)
		}
	}
	return nil
}

func (f *fakeServer) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.Contains(sql, "synchronized_standby_slots"):
		return fakeRow{vals: []any{f.setting}}
	case strings.Contains(sql, "pg_current_wal_insert_lsn"):
		return fakeRow{vals: []any{f.insert}}
	case strings.Contains(sql, "pg_replication_slots"):
		names := args[0].([]string)
		var least cdc.LSN
		for i, n := range names {
			lsn, ok := f.restart[n]
			if !ok {
				return fakeRow{vals: []any{nil}}
			}
			if i == 0 || lsn < least {
				least = lsn
			}
		}
		return fakeRow{vals: []any{least}}
	}
	return fakeRow{err: fmt.Errorf("fake: unexpected query %q", sql)}
}

func (f *fakeServer) set(fn func(f *fakeServer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// acks records what the gate confirmed.
type acks struct {
	mu  sync.Mutex
	got []cdc.LSN
}

func (a *acks) ack(w cdc.LSN) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, w)
}

func (a *acks) last() cdc.LSN {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.got) == 0 {
		return 0
	}
	return a.got[len(a.got)-1]
}

func (a *acks) all() []cdc.LSN {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]cdc.LSN(nil), a.got...)
}

func newGate(t *testing.T, f *fakeServer) (*StandbyGate, *acks) {
	t.Helper()
	a := &acks{}
	g := NewStandbyGate(f, a.ack, nil)
	g.Poll = time.Millisecond
	g.Refresh = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return g, a
}

func waitAck(t *testing.T, a *acks, want cdc.LSN) {
	t.Helper()
	if !wait.Until(10*time.Second, time.Millisecond, func() bool { return a.last() == want }) {
		t.Fatalf("confirmed %v, want the last to be %s", a.all(), want)
	}
}

// stays checks that nothing past want is confirmed for a while: the gate
// polls every millisecond, so a wrong release would show within it.
func stays(t *testing.T, g *StandbyGate, a *acks, want cdc.LSN) {
	t.Helper()
	if wait.Until(50*time.Millisecond, time.Millisecond, func() bool { return a.last() > want }) {
		t.Fatalf("confirmed %s while the standbys had not passed its flush (all: %v)", a.last(), a.all())
	}
	_ = g
}

func TestStandbyGatePassesAtOnceWithoutStandbys(t *testing.T) {
	f := &fakeServer{}
	g, a := newGate(t, f)
	g.Committed(100)
	if got := a.all(); len(got) != 1 || got[0] != 100 {
		t.Fatalf("confirmed %v, want [100] at once", got)
	}
	if g.Held() != 0 {
		t.Errorf("Held = %d, want 0", g.Held())
	}
}

// TestStandbyGateWaitsForEveryStandby: a W is confirmed only once every
// standby slot's restart_lsn reached the commit of the flush that wrote
// it, in order, and the previous W is what the slot keeps meanwhile.
func TestStandbyGateWaitsForEveryStandby(t *testing.T) {
	f := &fakeServer{setting: `a, "b"`, restart: map[string]cdc.LSN{"a": 0, "b": 0}}
	g, a := newGate(t, f)

	f.set(func(f *fakeServer) { f.insert = 1000 }) // W 100's flush ends before 1000
	g.Committed(100)
	f.set(func(f *fakeServer) { f.insert = 2000 })
	g.Committed(200)
	stays(t, g, a, 0)
	if g.Held() != 200 {
		t.Errorf("Held = %d, want 200 (W 200 committed, nothing confirmed)", g.Held())
	}
	if got := g.Slots(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("Slots = %v, want [a b]", got)
	}

	// One standby past the first flush is not enough.
	f.set(func(f *fakeServer) { f.restart["a"] = 5000 })
	stays(t, g, a, 0)
	// Both past the first flush only: W 100, not 200.
	f.set(func(f *fakeServer) { f.restart["b"] = 1500 })
	waitAck(t, a, 100)
	stays(t, g, a, 100)
	if g.Held() != 100 {
		t.Errorf("Held = %d, want 100", g.Held())
	}
	f.set(func(f *fakeServer) { f.restart["b"] = 2000 })
	waitAck(t, a, 200)
	if g.Held() != 0 {
		t.Errorf("Held = %d, want 0", g.Held())
	}
	for i, w := range a.all() {
		if i > 0 && w < a.all()[i-1] {
			t.Fatalf("confirmations went backwards: %v", a.all())
		}
	}
}

// TestStandbyGateMissingSlotHolds: a slot that synchronized_standby_slots
// names but that does not exist never passes a W, as PostgreSQL itself
// waits for it; clearing the setting releases the latest W.
func TestStandbyGateMissingSlotHolds(t *testing.T) {
	f := &fakeServer{setting: "a,gone", restart: map[string]cdc.LSN{"a": 9000}, insert: 1000}
	g, a := newGate(t, f)
	g.Committed(100)
	g.Committed(300)
	stays(t, g, a, 0)
	f.set(func(f *fakeServer) { f.setting = "" })
	waitAck(t, a, 300)
}
