package daemon

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// errMarksStopped: Sync was called after the mark writer stopped with
// marks still unwritten.
var errMarksStopped = errors.New("the dirty-mark writer stopped before writing every mark")

// mark is one dirty mark to write: keys of a counter, or (nil keys) the
// whole counter.
type mark struct {
	counter string
	keys    []string
	cause   string
	// quiet: the aggregator has logged it already (a degraded counter).
	quiet bool
}

// markWriter is the session's aggregator.Marks: the aggregator enqueues
// marks on its goroutine, and run writes them to PostgreSQL on its own.
// Sync waits until what was enqueued before it is written.
type markWriter struct {
	d     *Daemon
	write func(ctx context.Context, m mark) error

	mu       sync.Mutex
	queue    []mark
	enqueued uint64
	written  uint64
	err      error
	// progress is closed and replaced whenever written or err changes.
	progress chan struct{}
	kick     chan struct{}
	stopped  chan struct{}
}

var _ aggregator.Marks = (*markWriter)(nil)

func newMarkWriter(d *Daemon, write func(ctx context.Context, m mark) error) *markWriter {
	return &markWriter{d: d, write: write, progress: make(chan struct{}), kick: make(chan struct{}, 1), stopped: make(chan struct{})}
}

// writeMark is the production write: state.MarkDirty on the pool.
func (d *Daemon) writeMark(ctx context.Context, m mark) error {
	if err := state.MarkDirty(ctx, d.pool, d.cfg.Slot, m.counter, m.keys, m.cause); err != nil {
		return err
	}
	switch {
	case m.quiet:
	case m.keys != nil:
		d.log.Warn("keys marked dirty: reconciliation will measure them", zap.String("counter", m.counter), zap.Int("keys", len(m.keys)), zap.String("cause", m.cause))
	default:
		d.log.Warn("counter marked dirty: reconciliation will measure every key", zap.String("counter", m.counter), zap.String("cause", m.cause))
	}
	return nil
}

func (w *markWriter) enqueue(ms ...mark) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.queue = append(w.queue, ms...)
	w.enqueued += uint64(len(ms))
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// Dirty enqueues buffer fields ("counter:key") as dirty keys.
func (w *markWriter) Dirty(fields []string, cause string) error {
	byCounter := map[string][]string{}
	var names []string
	for _, f := range fields {
		if name, key, ok := counter.SplitField(f); ok {
			if _, seen := byCounter[name]; !seen {
				names = append(names, name)
			}
			byCounter[name] = append(byCounter[name], key)
		}
	}
	ms := make([]mark, 0, len(names))
	for _, name := range names {
		ms = append(ms, mark{counter: name, keys: byCounter[name], cause: cause})
	}
	return w.enqueue(ms...)
}

// DirtyCounters enqueues whole counters as dirty.
func (w *markWriter) DirtyCounters(names []string, cause string) error {
	ms := make([]mark, 0, len(names))
	for _, name := range names {
		ms = append(ms, mark{counter: name, cause: cause})
	}
	return w.enqueue(ms...)
}

// Degraded records at once, in memory, whether the counter can be kept
// from the stream, and enqueues a degraded counter as dirty: once it can
// be kept again, the reconciler repairs it (design rule 14).
func (w *markWriter) Degraded(name string, degraded bool, why string) error {
	d := w.d
	d.mu.Lock()
	if d.state.degraded == nil {
		d.state.degraded = map[string]bool{}
	}
	d.state.degraded[name] = degraded
	d.mu.Unlock()
	if !degraded {
		return nil
	}
	return w.enqueue(mark{counter: name, cause: why, quiet: true})
}

// Sync waits until every mark enqueued before it is written, and returns
// the write error that stopped the writer, if any.
func (w *markWriter) Sync(ctx context.Context) error {
	w.mu.Lock()
	target := w.enqueued
	w.mu.Unlock()
	for {
		w.mu.Lock()
		err, written, progress := w.err, w.written, w.progress
		w.mu.Unlock()
		if err != nil {
			return err
		}
		if written >= target {
			return nil
		}
		select {
		case <-progress:
		case <-w.stopped:
			w.mu.Lock()
			err, written = w.err, w.written
			w.mu.Unlock()
			if err != nil {
				return err
			}
			if written >= target {
				return nil
			}
			return errMarksStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run writes the enqueued marks in order until ctx is done or a write
// fails; the failure ends the session, as the synchronous write did.
func (w *markWriter) run(ctx context.Context) error {
	defer close(w.stopped)
	for {
		select {
		case <-w.kick:
		case <-ctx.Done():
			return nil
		}
		w.mu.Lock()
		batch := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, m := range batch {
			// A write once begun finishes even when the session stops,
			// as it did on the aggregator's goroutine.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			err := w.write(wctx, m)
			cancel()
			w.mu.Lock()
			if err != nil {
				w.err = err
			} else {
				w.written++
			}
			close(w.progress)
			w.progress = make(chan struct{})
			w.mu.Unlock()
			if err != nil {
				return err
			}
		}
	}
}
