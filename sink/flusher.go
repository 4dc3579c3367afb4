package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/state"
)

// DefaultChunkSize is how many keys one UPDATE statement carries.
const DefaultChunkSize = 5000

var (
	// ErrCheckpointMoved means the checkpoint is neither W nor past the
	// batch being flushed: someone else wrote it. The session must
	// restart.
	ErrCheckpointMoved = errors.New("checkpoint moved under the flusher")
	// ErrNotRunning is returned by Request when the flusher's loop is not
	// running (the session ended or has not started).
	ErrNotRunning = errors.New("the flusher is not running")
)

// Buffer is the part of the buffer the flusher uses: the atomic hand-over
// of everything buffered past W, and the two ways a flush ends (design
// rules 6 and 7). buffer.Redis implements it.
type Buffer interface {
	// HandOver starts or resumes a flush from w and returns it, its
	// deltas read atomically with the hand-over; ok is false when nothing
	// lies past w. It fails with an error wrapping buffer.ErrChainBroken
	// when the buffer does not start at w or a key it needs was lost.
	HandOver(ctx context.Context, w cdc.LSN) (b buffer.Batch, ok bool, err error)
	// Done ends the flush of (from, upto] after its PostgreSQL commit.
	Done(ctx context.Context, from, upto cdc.LSN) error
	// Advance moves an empty chain from w to next, which PostgreSQL
	// reached without the buffer (a TRUNCATE barrier).
	Advance(ctx context.Context, w, next cdc.LSN) error
}

// AckFunc hands W to cdc once it is durable in PostgreSQL.
type AckFunc func(lsn cdc.LSN)

// Options configure a Flusher.
type Options struct {
	Pool     *pgxpool.Pool
	Buffer   Buffer
	Slot     string
	Counters []counter.Counter
	// Ack is called with every new W; nil ignores it.
	Ack AckFunc
	// Lag receives the applied positions for walcount_apply_lag_seconds;
	// nil ignores them.
	Lag *LagTracker
	// ChunkSize: default DefaultChunkSize.
	ChunkSize int
	Metrics   *metrics.Metrics
	// Tally, when not nil, counts the deltas flushed and dropped per
	// counter for /status, across sessions.
	Tally  *counter.Tally
	Logger *zap.Logger
	// Failpoints are armed by crash tests; nil in production.
	Failpoints *failpoint.Set
	// FlushLog remembers what each flush applied for the aggregator;
	// nil keeps nothing.
	FlushLog *FlushLog
}

// Flusher applies the Redis buffer to PostgreSQL. Its methods are safe for
// concurrent use and run one at a time.
type Flusher struct {
	opt     Options
	log     *zap.Logger
	targets map[string]*counter.Resolved

	// requests carries flushes asked for by others (reconciliation) to
	// Run's loop, so that a flush error ends the session wherever the
	// flush was asked for; done is closed when Run returns.
	requests chan chan error
	done     chan struct{}

	mu        sync.Mutex
	w         cdc.LSN
	lastFlush time.Time
}

// NewFlusher resolves the counters' targets and reads W.
func NewFlusher(ctx context.Context, opt Options) (*Flusher, error) {
	if opt.ChunkSize <= 0 {
		opt.ChunkSize = DefaultChunkSize
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	f := &Flusher{opt: opt, log: opt.Logger, targets: make(map[string]*counter.Resolved),
		requests: make(chan chan error), done: make(chan struct{})}
	for _, c := range opt.Counters {
		t, err := counter.Resolve(ctx, opt.Pool, c)
		if err != nil {
			return nil, err
		}
		f.targets[c.Name] = t
	}
	w, err := state.ReadCheckpoint(ctx, opt.Pool, opt.Slot)
	if err != nil {
		return nil, err
	}
	f.w = w
	return f, nil
}

// SetAck sets the function that receives every new W. Call it before the
// flusher runs.
func (f *Flusher) SetAck(ack AckFunc) {
	f.mu.Lock()
	f.opt.Ack = ack
	f.mu.Unlock()
}

// W returns the checkpoint as this flusher last committed or read it.
func (f *Flusher) W() cdc.LSN {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.w
}

// LastFlush returns when the last flush committed.
func (f *Flusher) LastFlush() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastFlush
}

// Run flushes every interval, and whenever Request asks, until ctx is
// done. It returns the first error; the caller restarts the session. Call
// it once.
func (f *Flusher) Run(ctx context.Context, interval time.Duration) error {
	defer close(f.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var reply chan error
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case reply = <-f.requests:
		}
		_, err := f.Flush(ctx)
		if reply != nil {
			reply <- err
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// Request makes Run flush now and returns the flush's error. It fails with
// ErrNotRunning when Run is not running.
func (f *Flusher) Request(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case f.requests <- reply:
	case <-f.done:
		return ErrNotRunning
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Flush applies everything buffered past W, or resumes an unfinished
// flush. It reports whether W moved.
func (f *Flusher) Flush(ctx context.Context) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.flushLocked(ctx)
}

func (f *Flusher) flushLocked(ctx context.Context) (bool, error) {
	start := time.Now()
	hb, ok, err := f.opt.Buffer.HandOver(ctx, f.w)
	if err != nil || !ok {
		return false, err
	}
	from, upto, fields := hb.From, hb.Upto, hb.Deltas
	batches, err := f.group(fields)
	if err != nil {
		return false, err
	}
	applied, err := f.apply(ctx, from, upto, fields, batches, nil)
	if err != nil {
		f.opt.Metrics.FlushErrors.Inc()
		return false, err
	}
	if err := f.opt.Failpoints.Inject(failpoint.AfterCommit); err != nil {
		return false, err
	}
	if err := f.opt.Buffer.Done(ctx, from, upto); err != nil {
		return false, err
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeAck); err != nil {
		return false, err
	}
	f.committed(upto)
	if applied {
		f.opt.Metrics.Flushes.Inc()
		f.opt.Metrics.FlushDuration.Observe(time.Since(start).Seconds())
		f.log.Debug("flushed", zap.String("from", from.String()), zap.String("upto", upto.String()),
			zap.Int("keys", len(fields)), zap.Duration("took_seconds", time.Since(start)))
	}
	return true, nil
}

// committed records a new W and hands it on.
func (f *Flusher) committed(w cdc.LSN) {
	f.w = w
	f.opt.FlushLog.prune(w)
	f.lastFlush = time.Now()
	f.opt.Metrics.CheckpointLSN.Set(float64(w))
	if f.opt.Lag != nil {
		f.opt.Lag.Applied(w, f.lastFlush, f.opt.Metrics.ApplyLag)
	}
	if f.opt.Ack != nil {
		f.opt.Ack(w)
	}
}

// counterBatch is one counter's deltas, sorted by key.
type counterBatch struct {
	t      *counter.Resolved
	keys   []string
	deltas []int64
}

// group splits buffer fields by counter and sorts each counter's keys.
func (f *Flusher) group(fields map[string]int64) ([]*counterBatch, error) {
	by := make(map[string]*counterBatch)
	for field, n := range fields {
		name, key, ok := counter.SplitField(field)
		if !ok {
			return nil, fmt.Errorf("group deltas: malformed buffer field %q", field)
		}
		if n == 0 {
			continue
		}
		t := f.targets[name]
		if t == nil {
			// The counter was removed from the config while its deltas
			// were buffered: there is nowhere to apply them.
			f.log.Warn("dropping deltas of an unknown counter", zap.String("counter", name), zap.String("key", key))
			f.opt.Metrics.DeltasDropped.WithLabelValues(name).Inc()
			f.opt.Tally.Add(name, counter.TallyDropped, 1)
			continue
		}
		b := by[name]
		if b == nil {
			b = &counterBatch{t: t}
			by[name] = b
		}
		b.keys = append(b.keys, key)
		b.deltas = append(b.deltas, n)
	}
	out := make([]*counterBatch, 0, len(by))
	for _, b := range by {
		sort.Sort(byKey{b})
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *counterBatch) int { return compareStrings(a.t.Counter.Name, b.t.Counter.Name) })
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// byKey sorts a counterBatch by key: numerically for integer keys.
type byKey struct{ b *counterBatch }

func (s byKey) Len() int { return len(s.b.keys) }
func (s byKey) Swap(i, j int) {
	s.b.keys[i], s.b.keys[j] = s.b.keys[j], s.b.keys[i]
	s.b.deltas[i], s.b.deltas[j] = s.b.deltas[j], s.b.deltas[i]
}
func (s byKey) Less(i, j int) bool {
	a, b := s.b.keys[i], s.b.keys[j]
	if s.b.t.IntKey {
		x, errx := strconv.ParseInt(a, 10, 64)
		y, erry := strconv.ParseInt(b, 10, 64)
		if errx == nil && erry == nil {
			return x < y
		}
	}
	return a < b
}

// apply runs one PostgreSQL transaction: checkpoint compare-and-set from
// W=from to upto first, then optional resets (a TRUNCATE barrier), then
// the counter updates. It reports false, without error, when the batch
// had already been committed.
func (f *Flusher) apply(ctx context.Context, from, upto cdc.LSN, fields map[string]int64, batches []*counterBatch, resets []*counter.Resolved) (bool, error) {
	tx, err := f.opt.Pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin flush: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	moved, err := state.CompareAndSet(ctx, tx, f.opt.Slot, from, upto)
	if err != nil {
		return false, err
	}
	if !moved {
		// Someone committed this batch already (a retried flush or a
		// takeover). Nothing is applied; learn where W is now.
		_ = tx.Rollback(ctx)
		w, err := state.ReadCheckpoint(ctx, f.opt.Pool, f.opt.Slot)
		if err != nil {
			return false, err
		}
		if w < upto {
			return false, fmt.Errorf("flush (%s, %s]: %w: checkpoint is %s", from, upto, ErrCheckpointMoved, w)
		}
		f.log.Info("batch was already applied; skipping it", zap.String("upto", upto.String()), zap.String("checkpoint", w.String()))
		return false, nil
	}
	for _, t := range resets {
		if _, err := tx.Exec(ctx, t.Reset); err != nil {
			return false, fmt.Errorf("reset counter %s: %w", t.Counter.Name, err)
		}
	}
	var missed map[string]bool
	for _, b := range batches {
		var flushed, dropped int64
		for lo := 0; lo < len(b.keys); lo += f.opt.ChunkSize {
			hi := min(lo+f.opt.ChunkSize, len(b.keys))
			rows, err := tx.Query(ctx, b.t.Flush, b.keys[lo:hi], b.deltas[lo:hi])
			if err != nil {
				return false, fmt.Errorf("update counter %s: %w", b.t.Counter.Name, err)
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return false, fmt.Errorf("update counter %s: %w", b.t.Counter.Name, err)
			}
			flushed += int64(hi - lo)
			dropped += int64(len(keys))
			for _, k := range keys {
				if missed == nil {
					missed = map[string]bool{}
				}
				missed[counter.Field(b.t.Counter.Name, k)] = true
			}
		}
		f.opt.Metrics.DeltasFlushed.WithLabelValues(b.t.Counter.Name).Add(float64(flushed - dropped))
		f.opt.Tally.Add(b.t.Counter.Name, counter.TallyFlushed, flushed-dropped)
		if dropped > 0 {
			// The target rows went away; the Rails buffer pattern drops
			// these deltas too.
			f.opt.Metrics.DeltasDropped.WithLabelValues(b.t.Counter.Name).Add(float64(dropped))
			f.opt.Tally.Add(b.t.Counter.Name, counter.TallyDropped, dropped)
		}
	}
	// The marker places this transaction in the stream, among the target
	// rows' lifecycle events (see package aggregator); the log holds what
	// it applied until the stream has met it. A flush without deltas has
	// nothing to follow, and emits nothing: a marker is a transaction the
	// next flush carries, and an idle walcount must stay idle.
	if len(batches) > 0 {
		if err := cdc.PostMessage(ctx, tx, cdc.FlushMarker(f.opt.Slot, upto)); err != nil {
			return false, fmt.Errorf("flush marker: %w", err)
		}
		f.opt.FlushLog.add(upto, fields, missed)
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeCommit); err != nil {
		f.opt.FlushLog.drop(upto)
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit's outcome is unknown when the connection broke: keep
		// the record, which costs nothing if the flush did not commit.
		return false, fmt.Errorf("commit flush: %w", err)
	}
	return true, nil
}

// Barrier applies a TRUNCATE: everything buffered before it is flushed,
// then one transaction zeroes the truncated counters, applies the
// transaction's own later deltas and moves W to end (design rule 10).
// The caller must not add to the buffer while Barrier runs.
func (f *Flusher) Barrier(ctx context.Context, end cdc.LSN, reset []string, deltas []counter.Delta) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.flushLocked(ctx); err != nil {
		return err
	}
	var resets []*counter.Resolved
	for _, name := range reset {
		if t := f.targets[name]; t != nil {
			resets = append(resets, t)
		}
	}
	fields := make(map[string]int64, len(deltas))
	for _, d := range deltas {
		fields[d.Field] += d.N
	}
	batches, err := f.group(fields)
	if err != nil {
		return err
	}
	from := f.w
	if _, err := f.apply(ctx, from, end, fields, batches, resets); err != nil {
		return err
	}
	if err := f.opt.Buffer.Advance(ctx, from, end); err != nil {
		return err
	}
	f.committed(end)
	f.log.Info("applied truncate barrier", zap.Strings("counters", reset), zap.String("lsn", end.String()))
	return nil
}
