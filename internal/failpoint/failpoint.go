// Package failpoint lets tests stop walcount at the exact places where a
// crash matters for exactly-once delivery (DESIGN §4). In production no
// failpoint is armed and Inject costs one atomic load.
package failpoint

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Names of the failpoints, one per crash point of DESIGN §4.
const (
	// AfterApply fires after a batch was applied to Redis, before any ack.
	AfterApply = "aggregator.after-apply"
	// MidTransaction fires between two changes of one source transaction.
	MidTransaction = "aggregator.mid-transaction"
	// BeforeCommit fires after the buffer was renamed to flushing and the
	// counter updates ran, before the PostgreSQL commit.
	BeforeCommit = "sink.before-commit"
	// AfterCommit fires after the PostgreSQL commit, before DEL flushing.
	AfterCommit = "sink.after-commit"
	// BeforeAck fires after DEL flushing, before W is handed to cdc.
	BeforeAck = "sink.before-ack"
)

// ErrCrash is returned by an armed failpoint. Whoever receives it must
// stop at once, as a killed process would: no final flush, no ack.
var ErrCrash = errors.New("failpoint: simulated crash")

var (
	armed atomic.Int32
	mu    sync.Mutex
	hooks = map[string]func() error{}
)

// Arm makes Inject(name) return what fn returns. Disarm with the returned
// func.
func Arm(name string, fn func() error) (disarm func()) {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := hooks[name]; !ok {
		armed.Add(1)
	}
	hooks[name] = fn
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := hooks[name]; ok {
			delete(hooks, name)
			armed.Add(-1)
		}
	}
}

// CrashAfter arms name to return ErrCrash on its n-th call (1-based) and
// nil before. It is the usual way tests use failpoints.
func CrashAfter(name string, n int) (disarm func()) {
	var calls atomic.Int64
	return Arm(name, func() error {
		if calls.Add(1) == int64(n) {
			return fmt.Errorf("%w at %s", ErrCrash, name)
		}
		return nil
	})
}

// Inject returns the armed hook's error for name, or nil.
func Inject(name string) error {
	if armed.Load() == 0 {
		return nil
	}
	mu.Lock()
	fn := hooks[name]
	mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn()
}
