package wait

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	if !Until(time.Minute, time.Millisecond, func() bool { return calls.Add(1) == 3 }) {
		t.Fatal("Until gave up on a condition that held at the third call")
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3 (no call after it held)", n)
	}
}

func TestUntilGivesUp(t *testing.T) {
	var calls atomic.Int32
	if Until(10*time.Millisecond, time.Millisecond, func() bool { calls.Add(1); return false }) {
		t.Fatal("Until reported a condition that never held")
	}
	if calls.Load() < 2 {
		t.Fatalf("cond called %d times: asked once at the start and once at the deadline at least", calls.Load())
	}
}
