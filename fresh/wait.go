package fresh

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/metrics"
)

const (
	// pollInterval is how often the watcher reads meta.lsn while a read
	// waits: one HGET for all waiters.
	pollInterval = 2 * time.Millisecond
	// nudgeAfter is how long a waiter waits before the watcher emits a
	// heartbeat for it, so that a quiet database still makes a transaction
	// past its LSN; not when the stream has received past it already (the
	// aggregator then hands it over to Redis within its pending age).
	nudgeAfter = 20 * time.Millisecond
	// tipTimeout bounds one read of meta.lsn.
	tipTimeout = time.Second
)

// watcher follows meta.lsn for the reads that wait for an LSN
// (docs/design.md §7): one goroutine, running only while some read waits.
type watcher struct {
	buf      *buffer.Redis
	emit     func(ctx context.Context) (LSN, error)
	received func() LSN
	log      *zap.Logger
	m        *metrics.Metrics

	mu       sync.Mutex
	tip      LSN
	waiters  map[*waiter]struct{}
	polling  bool
	emitting bool
}

type waiter struct {
	min   LSN
	since time.Time
	done  chan struct{}
	// nudged is set once a heartbeat was emitted while the waiter waited:
	// that heartbeat lies past any LSN the database had written when the
	// read started, so a second one cannot help it (a min_lsn from the
	// future waits for its timeout without making WAL).
	nudged bool
}

func newWatcher(buf *buffer.Redis, emit func(ctx context.Context) (LSN, error), received func() LSN, log *zap.Logger, m *metrics.Metrics) *watcher {
	return &watcher{buf: buf, emit: emit, received: received, log: log, m: m, waiters: map[*waiter]struct{}{}}
}

// waitFor returns once meta.lsn ≥ min, with the LSN seen; on ctx's end it
// returns the last LSN seen and ctx's error.
func (w *watcher) waitFor(ctx context.Context, min LSN) (LSN, error) {
	w.mu.Lock()
	wt := &waiter{min: min, since: time.Now(), done: make(chan struct{})}
	w.waiters[wt] = struct{}{}
	if !w.polling {
		w.polling = true
		go w.poll()
	}
	w.mu.Unlock()
	select {
	case <-wt.done:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.tip, nil
	case <-ctx.Done():
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.waiters, wt)
		return w.tip, ctx.Err()
	}
}

func (w *watcher) poll() {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), tipTimeout)
		m, err := w.buf.Meta(ctx)
		cancel()
		var rec LSN
		if w.received != nil {
			rec = w.received()
		}
		w.mu.Lock()
		if err == nil && m.Exists && m.Part == "" {
			// The chain's tip as it is now: after a reset it may be lower
			// than before, and waiters wait for the replay.
			w.tip = m.LSN
		}
		var oldest time.Time
		for wt := range w.waiters {
			if wt.min <= w.tip {
				close(wt.done)
				delete(w.waiters, wt)
				continue
			}
			if !wt.nudged && wt.min > rec && (oldest.IsZero() || wt.since.Before(oldest)) {
				oldest = wt.since
			}
		}
		if len(w.waiters) == 0 {
			w.polling = false
			w.mu.Unlock()
			return
		}
		if w.emit != nil && !w.emitting && !oldest.IsZero() && time.Since(oldest) >= nudgeAfter {
			w.emitting = true
			for wt := range w.waiters {
				wt.nudged = true
			}
			go w.nudge()
		}
		w.mu.Unlock()
		<-t.C
	}
}

// nudge emits one heartbeat; its LSN lies past every LSN a waiter asked
// for when it started, so the waiters end once it is in the chain.
func (w *watcher) nudge() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := w.emit(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.emitting = false
	if err != nil {
		w.log.Debug("fresh read: heartbeat for a waiting read failed", zap.Error(err))
		for wt := range w.waiters {
			wt.nudged = false
		}
		return
	}
	w.m.FreshReadNudges.Inc()
}
