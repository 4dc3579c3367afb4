// Package failpoint lets tests stop walcount at the exact places where a
// crash matters for exactly-once delivery (docs/design.md §4). A Set belongs to one
// daemon, so crash tests run side by side; in production the Set is nil
// and Inject costs a nil check.
package failpoint

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/walcount/walcount/internal/operator"
)

// Names of the failpoints: one per crash point of docs/design.md §4, and
// AfterMeasure, where a test changes the database between measurements.
const (
	// AfterApply fires after a batch was applied to Redis, before any ack.
	AfterApply = "aggregator.after-apply"
	// AfterSpill fires after part of a source transaction not committed
	// yet was written to Redis (aggregator_transaction_keys).
	AfterSpill = "aggregator.after-spill"
	// MidTransaction fires between two changes of one source transaction.
	MidTransaction = "aggregator.mid-transaction"
	// BeforeCommit fires after the buffer was renamed to flushing and the
	// counter updates ran, before the PostgreSQL commit.
	BeforeCommit = "sink.before-commit"
	// AfterCommit fires after the PostgreSQL commit, before DEL flushing.
	AfterCommit = "sink.after-commit"
	// BeforeEvents fires after the PostgreSQL commit of a flush (or a
	// piece of a big batch) that changed keys with change events, before
	// the events are published to Redis.
	BeforeEvents = "sink.before-events"
	// BeforeAck fires after DEL flushing, before W is handed to cdc.
	BeforeAck = "sink.before-ack"
	// BetweenPieces fires after a piece of a big batch committed, before
	// the next piece begins.
	BetweenPieces = "sink.between-pieces"
	// AfterCorrection fires after a reconciliation emitted its
	// corrections into the WAL, before any flush applied them.
	AfterCorrection = "reconcile.after-correction"
	// AfterMeasure fires after a reconciliation's measurement read its
	// snapshot and its marker M1 arrived, before the pass weighs it: a
	// test changes the database between two measurements there.
	AfterMeasure = "reconcile.after-measure"
	// ViaCollect fires after a collection of via rows deleted a batch of
	// them, before its commit.
	ViaCollect = "daemon.via-collect"
)

// ErrCrash is returned by an armed failpoint. Whoever receives it must
// stop at once, as a killed process would: no final flush, no ack.
var ErrCrash = operator.NewError("failpoint: simulated crash")

// Set holds the armed failpoints of one daemon. The zero value has none
// armed; a nil *Set is valid and never fires. It is safe for concurrent
// use.
type Set struct {
	armed atomic.Int32
	mu    sync.Mutex
	hooks map[string]func() error
}

// Arm makes Inject(name) return what fn returns. Disarm with the returned
// func.
func (s *Set) Arm(name string, fn func() error) (disarm func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hooks == nil {
		s.hooks = map[string]func() error{}
	}
	if _, ok := s.hooks[name]; !ok {
		s.armed.Add(1)
	}
	s.hooks[name] = fn
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.hooks[name]; ok {
			delete(s.hooks, name)
			s.armed.Add(-1)
		}
	}
}

// CrashAfter arms name to return ErrCrash on its n-th call (1-based) and
// nil before. It is the usual way tests use failpoints.
func (s *Set) CrashAfter(name string, n int) (disarm func()) {
	var calls atomic.Int64
	return s.Arm(name, func() error {
		if calls.Add(1) == int64(n) {
			return fmt.Errorf("%w at %s", ErrCrash, name)
		}
		return nil
	})
}

// Inject returns the armed hook's error for name, or nil.
func (s *Set) Inject(name string) error {
	if s == nil || s.armed.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	fn := s.hooks[name]
	s.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn()
}
