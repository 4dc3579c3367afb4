// Package wait is the test kit's wait on a condition: a test asks for
// what it needs to see (a position reached, a row counted, a server
// answering) and goes on the moment it holds, instead of sleeping for a
// time that is too long on a quiet machine and too short on a busy one.
//
// The package is walcount's own code, not a stable API: it is importable
// only by walcount's tests.
package wait

import (
	"testing"
	"time"
)

// DefaultPoll is how often For and Until ask when the caller does not say.
const DefaultPoll = 20 * time.Millisecond

// Until asks cond every poll (DefaultPoll when poll is 0), the first time
// at once, until it returns true or within has passed; it reports whether
// cond held. cond runs on the caller's goroutine.
func Until(within, poll time.Duration, cond func() bool) bool {
	if poll <= 0 {
		poll = DefaultPoll
	}
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
}

// For is Until that fails tb, naming what it waited for, when cond does
// not hold within.
func For(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Until(within, 0, cond) {
		tb.Fatalf("timed out after %s waiting for %s", within, what)
	}
}
