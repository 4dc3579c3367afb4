package counter

import (
	"sync"
	"sync/atomic"
)

// Kinds of events a Tally counts, besides the row operations (insert,
// update, delete, truncate) of a counter's source.
const (
	TallyFlushed     = "flushed"     // non-zero deltas applied to the target
	TallyDropped     = "dropped"     // deltas whose target row did not exist
	TallyCorrections = "corrections" // reconciliation corrections applied
)

// Tally counts events per counter and kind for the life of a process: the
// figures /status shows. The stage that produces an event owns its count
// (the aggregator its source changes, the flusher its deltas, the
// reconciler its corrections) and adds to it where it happens; the daemon
// only keeps the Tally across sessions and reads it. A nil *Tally counts
// nothing.
type Tally struct {
	mu    sync.Mutex
	cells map[[2]string]*atomic.Int64
}

// NewTally returns an empty Tally.
func NewTally() *Tally { return &Tally{cells: map[[2]string]*atomic.Int64{}} }

// Cell returns the count of counter and kind, for a hot path to keep and
// add to without a lookup. A nil Tally returns a cell nobody reads.
func (t *Tally) Cell(counter, kind string) *atomic.Int64 {
	if t == nil {
		return new(atomic.Int64)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := [2]string{counter, kind}
	c := t.cells[k]
	if c == nil {
		c = new(atomic.Int64)
		t.cells[k] = c
	}
	return c
}

// Add adds n to the count of counter and kind.
func (t *Tally) Add(counter, kind string, n int64) {
	if t == nil || n == 0 {
		return
	}
	t.Cell(counter, kind).Add(n)
}

// Get returns the count of counter and kind.
func (t *Tally) Get(counter, kind string) int64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	c := t.cells[[2]string{counter, kind}]
	t.mu.Unlock()
	if c == nil {
		return 0
	}
	return c.Load()
}
