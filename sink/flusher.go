package sink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Defaults of the flush's own bounds (Options).
const (
	// DefaultLockTimeout bounds a flush statement's wait for a table lock
	// (row locks it never waits for: it skips them).
	DefaultLockTimeout = 200 * time.Millisecond
	// DefaultStatementTimeout bounds one flush statement.
	DefaultStatementTimeout = 30 * time.Second
	// DefaultIdleTimeout ends a flush transaction that sits idle, holding
	// row locks, for that long (a walcount stopped in its tracks).
	DefaultIdleTimeout = 30 * time.Second
	// DefaultParkRetry is how long a parked key waits before a flush
	// tries it again.
	DefaultParkRetry = time.Minute
	// DefaultTransactionKeys is the most keys one flush transaction
	// updates: a bigger batch is staged in walcount.carried and applied in
	// pieces of at most this many keys (Options.TransactionKeys).
	DefaultTransactionKeys = 10000
	// DefaultTransactionTime is how long a piece of a big batch may hold
	// the target rows it updated before it commits
	// (Options.TransactionTime).
	DefaultTransactionTime = 200 * time.Millisecond
)

var (
	// ErrCheckpointMoved means the checkpoint is neither W nor past the
	// batch being flushed: someone else wrote it. The session must
	// restart.
	ErrCheckpointMoved = errors.New("checkpoint moved under the flusher")
	// errSlowFlush ends a flush transaction that updated rows for
	// TransactionTime with keys still to go; it rolled back, and its batch
	// is applied in pieces.
	errSlowFlush = errors.New("the flush took longer than its lock time")
	// ErrNotRunning is returned by Request when the flusher's loop is not
	// running (the session ended or has not started).
	ErrNotRunning = errors.New("the flusher is not running")
)

// Buffer is the part of the buffer the flusher uses: the atomic hand-over
// of everything buffered past W, and the two ways a flush ends (design
// rules 6 and 7). buffer.Redis implements it.
type Buffer interface {
	// Begin starts or resumes a flush from w and returns its range and
	// size; ok is false when nothing lies past w. It fails with an error
	// wrapping buffer.ErrChainBroken when the buffer does not start at w
	// or a key it needs was lost.
	Begin(ctx context.Context, w cdc.LSN) (h buffer.Handed, ok bool, err error)
	// Scan reads the deltas of the flush h in pages of about page fields,
	// calling fn with each (a field may come twice, with the same delta),
	// and returns its lifecycle moves in stream order. It fails with an
	// error wrapping buffer.ErrChainBroken when the hash changed or was
	// lost meanwhile.
	Scan(ctx context.Context, h buffer.Handed, page int, fn func(fields []string, deltas []int64) error) ([]counter.Move, error)
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
	// LockTimeout, StatementTimeout and IdleTimeout are the flush
	// transaction's lock_timeout, statement_timeout and
	// idle_in_transaction_session_timeout, set in it whatever the
	// database or the role sets; zero uses the defaults above.
	LockTimeout, StatementTimeout, IdleTimeout time.Duration
	// ParkRetry is how long a parked key waits before it is tried again;
	// default DefaultParkRetry.
	ParkRetry time.Duration
	// TransactionKeys bounds the keys one flush transaction updates, and
	// TransactionTime how long a piece of a big batch goes on updating
	// before it commits; zero uses the defaults above. A batch of more
	// keys is staged and applied in pieces (see Flush).
	TransactionKeys int
	TransactionTime time.Duration
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

	mu sync.Mutex
	// pace times the flush statements, to size them (see pacer).
	pace      pacer
	w         cdc.LSN
	lastFlush time.Time
	// prior holds, during a flush, the keys carried by earlier flushes
	// that it tries, as they were carried (after the batch's moves).
	prior map[string]state.Carried
	// drainDue is true while walcount.carried may hold more keys than one
	// transaction should update: after a big batch was staged, and at the
	// start of a session (an earlier one may have stopped in the middle).
	drainDue bool
	// inherited is the end of what an earlier session buffered in Redis
	// (see Inherit); zero when this session buffered everything.
	inherited cdc.LSN
}

// Inherit tells the flusher that Redis holds changes up to lsn that an
// earlier session aggregated. A flush of that session may have committed
// without the stream having met its marker: its record (what it applied,
// which keys hit no row) and the lifecycle events it crossed were that
// session's, and the crossed events may be in what it buffered, which
// this session flushes without streaming it again. So a flush of a batch
// that starts before lsn marks both ends of each of the batch's lifecycle
// moves dirty, in its own transaction (design rules 14 and 17); a move
// is a target row deleted or re-keyed, rare, and the repair measures
// only those keys. Call it before the first flush.
func (f *Flusher) Inherit(lsn cdc.LSN) {
	f.mu.Lock()
	f.inherited = lsn
	f.mu.Unlock()
}

// NewFlusher resolves the counters' targets and reads W.
func NewFlusher(ctx context.Context, opt Options) (*Flusher, error) {
	if opt.ChunkSize <= 0 {
		opt.ChunkSize = DefaultChunkSize
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = DefaultLockTimeout
	}
	if opt.StatementTimeout <= 0 {
		opt.StatementTimeout = DefaultStatementTimeout
	}
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = DefaultIdleTimeout
	}
	if opt.ParkRetry <= 0 {
		opt.ParkRetry = DefaultParkRetry
	}
	if opt.TransactionKeys <= 0 {
		opt.TransactionKeys = DefaultTransactionKeys
	}
	if opt.TransactionTime <= 0 {
		opt.TransactionTime = DefaultTransactionTime
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	f := &Flusher{opt: opt, log: opt.Logger, targets: make(map[string]*counter.Resolved),
		requests: make(chan chan error), done: make(chan struct{}), drainDue: true}
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
			if IsTransient(err) {
				// A table lock the app holds, or a statement past
				// walcount's own timeout: nothing was applied, and
				// the next flush tries the same batch again.
				f.log.Warn("flush gave up on a wait; trying again at the next flush", zap.Error(err))
				continue
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
	if f.drainDue {
		if err := f.drain(ctx); err != nil {
			f.opt.Metrics.FlushErrors.Inc()
			return false, err
		}
	}
	h, ok, err := f.opt.Buffer.Begin(ctx, f.w)
	if err != nil || !ok {
		return false, err
	}
	if h.Deltas > int64(f.opt.TransactionKeys) || !f.pace.fits(h.Deltas, f.opt.TransactionTime) {
		return f.flushBig(ctx, start, h)
	}
	fields := make(map[string]int64, h.Deltas)
	moves, err := f.opt.Buffer.Scan(ctx, h, 0, func(fs []string, ds []int64) error {
		for i, field := range fs {
			fields[field] = ds[i]
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if int64(len(fields)) != h.Deltas {
		return false, fmt.Errorf("hand over redis buffer: %w: read %d of %d flushing deltas", buffer.ErrChainBroken, len(fields), h.Deltas)
	}
	from, upto := h.From, h.Upto
	applied, err := f.apply(ctx, from, upto, fields, moves, nil, true)
	if errors.Is(err, errSlowFlush) {
		// The rows were slower than the pace known so far: the batch's
		// keys would have held their row locks too long in one
		// transaction, which rolled back.
		f.log.Info("a flush took longer than flush_lock_time; applying its batch in pieces",
			zap.Int64("keys", h.Deltas), zap.Duration("flush_lock_time", f.opt.TransactionTime))
		return f.flushBig(ctx, start, h)
	}
	if err != nil {
		f.opt.Metrics.FlushErrors.Inc()
		return false, err
	}
	if err := f.end(ctx, from, upto); err != nil {
		return false, err
	}
	if applied {
		f.opt.Metrics.Flushes.Inc()
		f.opt.Metrics.FlushDuration.Observe(time.Since(start).Seconds())
		f.log.Debug("flushed", zap.String("from", from.String()), zap.String("upto", upto.String()),
			zap.Int("keys", len(fields)), zap.Duration("took_seconds", time.Since(start)))
	}
	return true, nil
}

// end finishes a flush committed in PostgreSQL: the flushing hash goes,
// and W moves on.
func (f *Flusher) end(ctx context.Context, from, upto cdc.LSN) error {
	if err := f.opt.Failpoints.Inject(failpoint.AfterCommit); err != nil {
		return err
	}
	if err := f.opt.Buffer.Done(ctx, from, upto); err != nil {
		return err
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeAck); err != nil {
		return err
	}
	f.committed(upto)
	return nil
}

// flushBig flushes a batch of more keys than one transaction may update,
// in bounded pieces. One transaction moves W from h.From to h.Upto, runs
// the batch's moves on the keys carried before, and stages the batch in
// walcount.carried, merged with them, read from Redis page by page and
// copied to the server page by page: it updates no target row, so it holds
// no lock an application waits for, and memory holds a page at a time.
// The counter columns plus walcount.carried then hold every delta up to
// the new W, exactly as after any flush (design rule 2), so a crash at any
// point later loses and doubles nothing. Then drain applies the carried
// keys in short transactions.
func (f *Flusher) flushBig(ctx context.Context, start time.Time, h buffer.Handed) (bool, error) {
	staged, err := f.stage(ctx, h)
	if err != nil {
		f.opt.Metrics.FlushErrors.Inc()
		return false, err
	}
	if err := f.end(ctx, h.From, h.Upto); err != nil {
		return false, err
	}
	if !staged {
		return true, nil
	}
	f.drainDue = true
	pieces, err := f.drainCount(ctx)
	if err != nil {
		f.opt.Metrics.FlushErrors.Inc()
		return false, err
	}
	f.opt.Metrics.Flushes.Inc()
	f.opt.Metrics.FlushDuration.Observe(time.Since(start).Seconds())
	f.log.Info("flushed a big batch in pieces", zap.String("from", h.From.String()), zap.String("upto", h.Upto.String()),
		zap.Int64("keys", h.Deltas), zap.Int("transactions", pieces+1), zap.Duration("took_seconds", time.Since(start)))
	return true, nil
}

// begin opens a flush transaction with walcount's own bounds, whatever the
// database or the role set: a flush waits for no row lock (it skips
// them), for a table lock at most lock_timeout, and never sits idle
// holding row locks. statement is the statement_timeout.
func (f *Flusher) begin(ctx context.Context, statement time.Duration) (pgx.Tx, error) {
	tx, err := f.opt.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin flush: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true),
set_config('idle_in_transaction_session_timeout', $3, true)`,
		ms(f.opt.LockTimeout), ms(statement), ms(f.opt.IdleTimeout)); err != nil {
		_ = tx.Rollback(context.Background())
		return nil, fmt.Errorf("begin flush: set timeouts: %w", err)
	}
	return tx, nil
}

// alreadyApplied handles a compare-and-set that matched no row: the batch
// of (from, upto] was committed by someone else, or the checkpoint moved.
func (f *Flusher) alreadyApplied(ctx context.Context, from, upto cdc.LSN) error {
	w, err := state.ReadCheckpoint(ctx, f.opt.Pool, f.opt.Slot)
	if err != nil {
		return err
	}
	if w < upto {
		return fmt.Errorf("flush (%s, %s]: %w: checkpoint is %s", from, upto, ErrCheckpointMoved, w)
	}
	f.log.Info("batch was already applied; skipping it", zap.String("upto", upto.String()), zap.String("checkpoint", w.String()))
	return nil
}

// stage is flushBig's first transaction. It reports false when the batch
// had already been committed.
func (f *Flusher) stage(ctx context.Context, h buffer.Handed) (bool, error) {
	// The copy of a big batch may take long, but it locks only the
	// checkpoint row and walcount.carried, which no application waits
	// for.
	tx, err := f.begin(ctx, 0)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	moved, err := state.CompareAndSet(ctx, tx, f.opt.Slot, h.From, h.Upto)
	if err != nil {
		return false, err
	}
	if !moved {
		_ = tx.Rollback(ctx)
		return false, f.alreadyApplied(ctx, h.From, h.Upto)
	}
	if err := state.CreateStage(ctx, tx); err != nil {
		return false, err
	}
	moves, err := f.opt.Buffer.Scan(ctx, h, f.opt.ChunkSize, func(fs []string, ds []int64) error {
		return state.CopyStage(ctx, tx, fs, ds)
	})
	if err != nil {
		return false, err
	}
	// The batch's moves run on the keys carried before it, which are of
	// the rows as they were at W (design rule 2). A drain ran before the
	// hand-over, so these are the keys it could not apply: held rows and
	// parked keys.
	loaded, err := state.LoadCarried(ctx, tx, f.opt.Slot)
	if err != nil {
		return false, err
	}
	carried, err := runMoves(slices.Clone(loaded), moves)
	if err != nil {
		return false, err
	}
	if err := state.UpdateCarried(ctx, tx, f.opt.Slot, loaded, carried, f.opt.ParkRetry); err != nil {
		return false, err
	}
	if h.From < f.inherited {
		if err := f.markInheritedMoves(ctx, tx, moves); err != nil {
			return false, err
		}
	}
	names := make([]string, 0, len(f.targets))
	for name := range f.targets {
		names = append(names, name)
	}
	staged, merged, dropped, err := state.StageCarried(ctx, tx, f.opt.Slot, names)
	if err != nil {
		return false, err
	}
	if staged != h.Deltas {
		return false, fmt.Errorf("hand over redis buffer: %w: read %d of %d flushing deltas", buffer.ErrChainBroken, staged, h.Deltas)
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeCommit); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit flush: %w", err)
	}
	if dropped > 0 {
		f.log.Warn("dropped the deltas of counters no longer configured", zap.Int64("keys", dropped))
	}
	f.log.Info("staged a big batch in walcount.carried; applying it in pieces", zap.String("upto", h.Upto.String()),
		zap.Int64("keys", merged), zap.Int("max_keys_per_transaction", f.opt.TransactionKeys),
		zap.Duration("max_transaction_time", f.opt.TransactionTime))
	return true, nil
}

// drain applies what walcount.carried holds in pieces, each its own
// transaction of at most TransactionKeys keys that stops taking more once
// it has spent TransactionTime updating, in (counter, key) order. A piece
// is a flush without a hand-over: it takes the checkpoint row's lock
// (SELECT … FOR UPDATE where W is still W), applies the carried deltas it can
// lock at once, writes back what it could not (the same rules as every
// flush: deferred, parked), and sends a flush marker for W, because its
// deltas are of the rows as they were at W and it may cross their
// lifecycle events as any flush does (design rule 17). Nothing moves W,
// so a crash between two pieces leaves the columns plus walcount.carried
// exact, and the next session's first flush drains the rest.
func (f *Flusher) drain(ctx context.Context) error {
	_, err := f.drainCount(ctx)
	return err
}

// drainCount is drain, reporting how many pieces it committed.
func (f *Flusher) drainCount(ctx context.Context) (int, error) {
	var cursor state.CarriedCursor
	pieces := 0
	for {
		next, more, did, err := f.drainPiece(ctx, cursor)
		if err != nil {
			return pieces, err
		}
		if did {
			pieces++
			f.opt.Metrics.FlushPieces.Inc()
		}
		if !more {
			f.drainDue = false
			return pieces, nil
		}
		cursor = next
		if err := f.opt.Failpoints.Inject(failpoint.BetweenPieces); err != nil {
			return pieces, err
		}
	}
}

// drainPiece runs one piece of drain from cursor, again with savepoints
// around the chunks that failed on a row's data (as apply does). It
// returns the cursor after it, whether keys may remain after it, and
// whether it committed anything.
func (f *Flusher) drainPiece(ctx context.Context, cursor state.CarriedCursor) (state.CarriedCursor, bool, bool, error) {
	suspects := map[string]bool{}
	var replay []int
	for {
		var sizes []int
		next, more, did, err := f.drainOnce(ctx, cursor, suspects, replay, &sizes)
		replay = sizes
		var de *dataError
		if errors.As(err, &de) && !suspects[de.chunk] {
			f.log.Warn("a flush chunk failed on a row's data; applying it again key by key to isolate the row",
				zap.String("counter", de.counter), zap.String("chunk", de.chunk), zap.Error(de.err))
			suspects[de.chunk] = true
			continue
		}
		return next, more, did, err
	}
}

// drainOnce is one try of drainPiece. It appends the size of each page it
// reads to sizes; replay are the sizes of the try before, which a retry
// uses again so that its chunks are the same.
func (f *Flusher) drainOnce(ctx context.Context, cursor state.CarriedCursor, suspects map[string]bool, replay []int, sizes *[]int) (state.CarriedCursor, bool, bool, error) {
	w := f.w
	tx, err := f.begin(ctx, f.opt.StatementTimeout)
	if err != nil {
		return cursor, false, false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	held, err := state.LockCheckpoint(ctx, tx, f.opt.Slot, w)
	if err != nil {
		return cursor, false, false, err
	}
	if !held {
		_ = tx.Rollback(ctx)
		now, err := state.ReadCheckpoint(ctx, f.opt.Pool, f.opt.Slot)
		if err != nil {
			return cursor, false, false, err
		}
		return cursor, false, false, fmt.Errorf("apply carried deltas at %s: %w: checkpoint is %s", w, ErrCheckpointMoved, now)
	}
	total := &outcome{applied: map[string]int64{}}
	prior := map[string]state.Carried{}
	// The time runs from the first statement that updates target rows:
	// their row locks are held from then until the commit. Each page is
	// one statement per counter, sized by the pace of the statements
	// before (see pacer), so that the piece commits about TransactionTime
	// after it first locked a row, however slow the rows are.
	var updating time.Time
	keys, more, attempted, last := 0, true, 0, 0
	for keys < f.opt.TransactionKeys {
		room := min(f.opt.ChunkSize, f.opt.TransactionKeys-keys)
		var limit int
		if n := len(*sizes); n < len(replay) {
			limit = replay[n] // a retry cuts the pages as its first try did
		} else {
			var elapsed time.Duration
			if !updating.IsZero() {
				elapsed = time.Since(updating)
			}
			var ok bool
			if limit, ok = f.pace.size(f.opt.TransactionTime, elapsed, last, room); !ok {
				break
			}
		}
		*sizes = append(*sizes, limit)
		pageStart := time.Now()
		page, next, err := state.LoadCarriedPage(ctx, tx, f.opt.Slot, cursor, limit)
		if err != nil {
			return cursor, false, false, err
		}
		if len(page) == 0 {
			more = false
			break
		}
		batches, out, err := f.plan(nil, nil, page)
		if err != nil {
			return cursor, false, false, err
		}
		if updating.IsZero() {
			updating = time.Now()
		}
		if err := f.awaitVisible(ctx, tx, batches); err != nil {
			return cursor, false, false, err
		}
		for _, b := range batches {
			var flushed, dropped int64
			for lo := 0; lo < len(b.keys); lo += f.opt.ChunkSize {
				hi := min(lo+f.opt.ChunkSize, len(b.keys))
				chunk := fmt.Sprintf("carried/%s/%s/%d", next.Key, b.t.Counter.Name, lo)
				if b.careful {
					chunk += "/retry"
				}
				n, d, err := f.chunk(ctx, tx, b, b.keys[lo:hi], b.deltas[lo:hi], b.careful || suspects[chunk], chunk, out)
				if err != nil {
					return cursor, false, false, err
				}
				flushed += n
				dropped += d
				attempted += hi - lo
			}
			out.counts = append(out.counts, counted{b.t.Counter.Name, flushed, dropped, b.t.Extremum})
		}
		if err := f.carry(ctx, tx, out, page); err != nil {
			return cursor, false, false, err
		}
		f.pace.learn(len(page), time.Since(pageStart))
		last = len(page)
		maps.Copy(total.applied, out.applied)
		for k := range out.missed {
			if total.missed == nil {
				total.missed = map[string]bool{}
			}
			total.missed[k] = true
		}
		total.parked = append(total.parked, out.parked...)
		total.created = append(total.created, out.created...)
		total.counts = append(total.counts, out.counts...)
		maps.Copy(prior, f.prior)
		keys += len(page)
		cursor = next
		if len(page) < limit {
			more = false
			break
		}
	}
	if attempted == 0 && len(total.parked) == 0 {
		// Nothing to apply (no keys, or only parked keys not due):
		// nothing was written.
		return cursor, more, false, nil
	}
	if len(total.applied) > 0 {
		piece := newPieceName()
		if err := cdc.PostMessage(ctx, tx, cdc.PieceMarker(f.opt.Slot, w, piece)); err != nil {
			return cursor, false, false, fmt.Errorf("flush marker: %w", err)
		}
		f.opt.FlushLog.add(w, piece, total.applied, total.missed)
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeCommit); err != nil {
		f.opt.FlushLog.drop(w)
		return cursor, false, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		// Unlike a flush that moves W, a piece is not tried again as
		// such: forget its record, so that a later piece's marker does
		// not take it (a piece that did commit then costs dirty marks,
		// never a wrong compensation).
		f.opt.FlushLog.drop(w)
		return cursor, false, false, fmt.Errorf("commit flush: %w", err)
	}
	f.prior = prior
	f.committedCarry(total)
	return cursor, more, true, nil
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

// apply runs one PostgreSQL transaction that moves the checkpoint from
// W=from to upto and applies the batch (design rule 2): checkpoint
// compare-and-set first, then optional resets (a TRUNCATE barrier), then
// the deltas carried from earlier flushes, with the batch's lifecycle
// moves run on them, merged with the batch's, then the counter updates,
// chunk by chunk, each locking only the rows it can lock at once; what it
// could not lock, or not write, is carried in walcount.carried, written
// in the same transaction. It reports false, without error, when the
// batch had already been committed.
//
// A data error on a row (SQLSTATE classes 22, 23, P0, or 42501) aborts
// the transaction; apply then runs it again with that chunk in a
// savepoint, split in halves until the keys that fail are alone, and
// parks those. Only the chunks that failed get savepoints: every
// subtransaction that writes takes an XID, and more than 64 of them in
// one transaction would slow every snapshot of the database.
func (f *Flusher) apply(ctx context.Context, from, upto cdc.LSN, fields map[string]int64, moves []counter.Move, resets []*counter.Resolved, bail bool) (bool, error) {
	suspects := map[string]bool{}
	var replay []int
	for {
		var sizes []int
		applied, err := f.applyOnce(ctx, from, upto, fields, moves, resets, suspects, bail, replay, &sizes)
		replay = sizes
		var de *dataError
		if errors.As(err, &de) && !suspects[de.chunk] {
			f.log.Warn("a flush chunk failed on a row's data; applying it again key by key to isolate the row",
				zap.String("counter", de.counter), zap.String("chunk", de.chunk), zap.Error(de.err))
			suspects[de.chunk] = true
			continue
		}
		return applied, err
	}
}

// dataError is a chunk's statement failing on a row's data.
type dataError struct {
	counter, chunk string
	err            error
}

func (e *dataError) Error() string {
	return fmt.Sprintf("update counter %s (chunk %s): %v", e.counter, e.chunk, e.err)
}
func (e *dataError) Unwrap() error { return e.err }

// isDataError reports whether err is an error of one row's data or
// privileges, which parks the row's key instead of failing the flush:
// SQLSTATE classes 22 (data exception), 23 (integrity constraint
// violation: a CHECK), P0 (PL/pgSQL: a trigger that raises) and 42501
// (insufficient privilege: a row-level security policy's WITH CHECK).
func isDataError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "P0") || pe.Code == "42501"
}

// isLockTimeout reports whether err is lock_timeout's.
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// IsTransient reports whether a flush failed on a wait walcount bounds
// itself (lock_timeout on a table lock, statement_timeout): nothing was
// applied, and the next flush tries again.
func IsTransient(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "57014")
}

// outcome is what one flush transaction did with its keys.
type outcome struct {
	// applied holds the deltas the flush applied, and those it dropped
	// for want of a row (missed): the flush log needs both (package
	// aggregator follows them when the flush crossed a lifecycle event).
	applied map[string]int64
	missed  map[string]bool
	carry   []state.Carried // deferred and parked keys, after the flush
	// parked are the keys parked by this flush, newly is true for those
	// not parked before (they get a dirty mark and a loud log).
	parked []parkedKey
	// counts are the keys applied and dropped per counter, for the
	// metrics once the flush committed.
	counts []counted
	// created are the keys whose target row the flush created
	// (create_missing).
	created []createdKey
}

type createdKey struct {
	counter, key string
	delta        int64
}

type counted struct {
	counter          string
	flushed, dropped int64
	// extremum: the keys flushed were recomputes of a max or min.
	extremum bool
}

type parkedKey struct {
	counter, key string
	delta        int64
	err          string
	newly        bool
}

// attemptBatch is a counterBatch with what the keys were carried as.
type attemptBatch struct {
	*counterBatch
	// careful: every chunk in a savepoint (parked keys tried again).
	careful bool
}

func (f *Flusher) applyOnce(ctx context.Context, from, upto cdc.LSN, fields map[string]int64, moves []counter.Move,
	resets []*counter.Resolved, suspects map[string]bool, bail bool, replay []int, sizes *[]int) (bool, error) {
	tx, err := f.begin(ctx, f.opt.StatementTimeout)
	if err != nil {
		return false, err
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
		return false, f.alreadyApplied(ctx, from, upto)
	}
	if len(resets) > 0 {
		names := make([]string, len(resets))
		for i, t := range resets {
			names[i] = t.Counter.Name
		}
		// The carried deltas of a truncated counter are of rows counted
		// before the TRUNCATE.
		if err := state.DropCarried(ctx, tx, f.opt.Slot, names); err != nil {
			return false, err
		}
	}
	var held []state.Carried
	for _, t := range resets {
		rows, err := tx.Query(ctx, t.Reset)
		if err != nil {
			return false, fmt.Errorf("reset counter %s: %w", t.Counter.Name, err)
		}
		// A row another transaction holds keeps its column: its reset is
		// carried, as the delta that takes the column to 0.
		err = func() error {
			defer rows.Close()
			for rows.Next() {
				c := state.Carried{Counter: t.Counter.Name, Due: true}
				if err := rows.Scan(&c.Key, &c.Delta); err != nil {
					return err
				}
				c.Delta = -c.Delta
				held = append(held, c)
			}
			return rows.Err()
		}()
		if err != nil {
			return false, fmt.Errorf("reset counter %s: %w", t.Counter.Name, err)
		}
	}
	prior, err := state.LoadCarried(ctx, tx, f.opt.Slot)
	if err != nil {
		return false, err
	}
	loaded := slices.Clone(prior) // plan changes prior's entries
	prior = append(prior, held...)
	batches, out, err := f.plan(fields, moves, prior)
	if err != nil {
		return false, err
	}
	if err := f.awaitVisible(ctx, tx, batches); err != nil {
		return false, err
	}
	// Statements sized by their pace (see pacer); once the transaction has
	// updated rows for TransactionTime with keys still to go, a flush
	// that may (bail) gives up, which frees its row locks at once, and
	// the batch is applied in pieces instead (errSlowFlush).
	var updating time.Time
	last := 0
	for _, b := range batches {
		var flushed, dropped int64
		for lo := 0; lo < len(b.keys); {
			var step int
			if n := len(*sizes); n < len(replay) {
				step = replay[n] // a retry cuts the chunks as its first try did
			} else {
				var elapsed time.Duration
				if !updating.IsZero() {
					elapsed = time.Since(updating)
				}
				var ok bool
				if step, ok = f.pace.size(f.opt.TransactionTime, elapsed, last, f.opt.ChunkSize); !ok {
					if bail {
						return false, errSlowFlush
					}
					step, _ = f.pace.size(f.opt.TransactionTime, 0, last, f.opt.ChunkSize)
				}
			}
			*sizes = append(*sizes, step)
			hi := min(lo+step, len(b.keys))
			chunk := fmt.Sprintf("%s/%d", b.t.Counter.Name, lo)
			if b.careful {
				chunk += "/retry"
			}
			careful := b.careful || suspects[chunk]
			began := time.Now()
			if updating.IsZero() {
				updating = began
			}
			n, d, err := f.chunk(ctx, tx, b, b.keys[lo:hi], b.deltas[lo:hi], careful, chunk, out)
			if err != nil {
				return false, err
			}
			f.pace.learn(hi-lo, time.Since(began))
			last = hi - lo
			flushed += n
			dropped += d
			lo = hi
		}
		out.counts = append(out.counts, counted{b.t.Counter.Name, flushed, dropped, b.t.Extremum})
	}
	if err := f.carry(ctx, tx, out, loaded); err != nil {
		return false, err
	}
	if from < f.inherited {
		if err := f.markInheritedMoves(ctx, tx, moves); err != nil {
			return false, err
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
		f.opt.FlushLog.replace(upto, out.applied, out.missed)
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
	f.committedCarry(out)
	return true, nil
}

// newPieceName returns a name for a piece's marker that no other process
// draws.
func newPieceName() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// ms renders a duration as a PostgreSQL setting in milliseconds.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// plan merges what earlier flushes carried into the batch: the batch's
// lifecycle moves run first on the carried deltas (they are of rows as
// they were at W), then a parked key not due yet keeps the batch's delta
// for it, and every other key is tried. Parked keys that are due are
// tried in batches of their own, chunk by chunk in savepoints.
func (f *Flusher) plan(fields map[string]int64, moves []counter.Move, prior []state.Carried) ([]*attemptBatch, *outcome, error) {
	out := &outcome{applied: map[string]int64{}}
	carried, err := moveCarried(prior, moves)
	if err != nil {
		return nil, nil, err
	}
	return f.planMoved(fields, carried, out)
}

// runMoves runs a batch's lifecycle moves on carried deltas and returns
// what is carried after them.
func runMoves(prior []state.Carried, moves []counter.Move) ([]state.Carried, error) {
	carried, err := moveCarried(prior, moves)
	if err != nil {
		return nil, err
	}
	out := make([]state.Carried, 0, len(carried))
	for _, c := range carried {
		if c.Delta != 0 {
			out = append(out, *c)
		}
	}
	return out, nil
}

// moveCarried runs moves on the carried deltas prior (changing its
// entries) and returns them by field.
func moveCarried(prior []state.Carried, moves []counter.Move) (map[string]*state.Carried, error) {
	carried := make(map[string]*state.Carried, len(prior))
	for i := range prior {
		c := &prior[i]
		carried[counter.Field(c.Counter, c.Key)] = c
	}
	for _, m := range moves {
		c := carried[m.Field]
		if c == nil {
			continue
		}
		delete(carried, m.Field)
		if m.To == "" {
			continue // the row was deleted: its deltas go with it
		}
		name, key, ok := counter.SplitField(m.To)
		if !ok {
			return nil, fmt.Errorf("carry deltas: malformed move to %q", m.To)
		}
		if to := carried[m.To]; to != nil {
			to.Delta += c.Delta
			if c.Since.Before(to.Since) {
				to.Since = c.Since
			}
			continue
		}
		c.Counter, c.Key = name, key
		carried[m.To] = c
	}
	return carried, nil
}

// planMoved is plan after the moves ran on the carried deltas.
func (f *Flusher) planMoved(fields map[string]int64, carried map[string]*state.Carried, out *outcome) ([]*attemptBatch, *outcome, error) {
	normal := make(map[string]int64, len(fields)+len(carried))
	retry := map[string]int64{}
	for field, n := range fields {
		if n != 0 {
			normal[field] = n
		}
	}
	f.prior = make(map[string]state.Carried, len(carried))
	for field, c := range carried {
		if c.Parked != "" && !c.Due {
			c.Delta += normal[field]
			delete(normal, field)
			if c.Delta != 0 {
				out.carry = append(out.carry, *c)
			}
			continue
		}
		f.prior[field] = *c
		if c.Parked != "" {
			retry[field] = c.Delta + normal[field]
			delete(normal, field)
			if retry[field] == 0 {
				delete(retry, field)
			}
			continue
		}
		if normal[field] += c.Delta; normal[field] == 0 {
			delete(normal, field)
		}
	}
	var batches []*attemptBatch
	for _, set := range []struct {
		fields  map[string]int64
		careful bool
	}{{normal, false}, {retry, true}} {
		bs, err := f.group(set.fields)
		if err != nil {
			return nil, nil, err
		}
		for _, b := range bs {
			batches = append(batches, &attemptBatch{counterBatch: b, careful: set.careful})
		}
	}
	return batches, out, nil
}

// Bounds of awaitVisible.
const (
	visibleWait = 5 * time.Second
	visiblePoll = 2 * time.Millisecond
)

// awaitVisible makes the extremum batches' recomputes see every
// transaction they were handed: a transaction's commit is in the WAL, and
// so in the stream, before other sessions see it, and with synchronous
// replication it stays invisible until a synchronous standby confirms it
// (the backend waits with wait_event SyncRep, its transaction committed in
// the WAL and the commit log, its xid still running). A recompute then
// would miss a delete and keep the deleted maximum for good. So the flush
// waits until the transactions waiting for a standby when it starts have
// ended (visible to the next statement's snapshot, READ COMMITTED), at
// most visibleWait. A transaction that starts waiting later committed
// after the batch's transactions were all in the WAL, so it is in a later
// batch, which recomputes its keys. After visibleWait the extremum keys
// are recomputed anyway and marked dirty, for reconciliation to measure.
// pg_stat_activity shows other roles' transactions only to a role with
// pg_read_all_stats (or a superuser). Batches of counts and sums do not
// wait: their deltas come from the stream.
func (f *Flusher) awaitVisible(ctx context.Context, tx pgx.Tx, batches []*attemptBatch) error {
	var ext []*attemptBatch
	for _, b := range batches {
		if b.t.Extremum && len(b.keys) > 0 {
			ext = append(ext, b)
		}
	}
	if len(ext) == 0 {
		return nil
	}
	var late []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(a.backend_xid::text), '{}') FROM pg_stat_activity a
WHERE a.wait_event = 'SyncRep' AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()`).Scan(&late); err != nil {
		return fmt.Errorf("read the transactions waiting for a synchronous standby: %w", err)
	}
	deadline := time.Now().Add(visibleWait)
	for len(late) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(visiblePoll):
		}
		// pg_stat_activity is read once per transaction unless cleared.
		if _, err := tx.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			return fmt.Errorf("wait for the transactions waiting for a synchronous standby: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT /* walcount: wait for synchronous standbys */ coalesce(array_agg(x), '{}') FROM unnest($1::text[]) AS x
WHERE EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid = x::xid)`, late).Scan(&late); err != nil {
			return fmt.Errorf("wait for the transactions waiting for a synchronous standby: %w", err)
		}
		if len(late) > 0 && time.Now().After(deadline) {
			f.log.Warn("transactions committed in the WAL still wait for a synchronous standby: max and min counters are recomputed without them and marked dirty for reconciliation",
				zap.Strings("xids", late), zap.Duration("waited", visibleWait))
			for _, b := range ext {
				if err := state.MarkDirty(ctx, tx, f.opt.Slot, b.t.Counter.Name, slices.Clone(b.keys), "a max or min was recomputed while a transaction committed in the WAL waited for a synchronous standby"); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return nil
}

// chunk runs the flush statement on one chunk of keys and sorts its keys
// into out: applied, without a row (missed), deferred (their row is
// locked by another transaction) or parked. In careful mode the chunk runs
// in a savepoint, and a data error splits it in halves until the failing
// keys are alone; outside it, a data error fails the transaction with a
// *dataError naming the chunk. It returns the keys applied and dropped.
func (f *Flusher) chunk(ctx context.Context, tx pgx.Tx, b *attemptBatch, keys []string, deltas []int64, careful bool, id string, out *outcome) (flushed, dropped int64, err error) {
	name := b.t.Counter.Name
	creates := b.t.Counter.CreateMissing
	// A create_missing chunk runs in a savepoint too: its INSERT waits
	// for an app transaction inserting the same key (no SKIP LOCKED for a
	// unique index), up to lock_timeout; the chunk is then split until
	// that key is alone, and the key is carried like a locked row.
	guarded := careful || creates
	if guarded {
		if _, err := tx.Exec(ctx, "SAVEPOINT walcount_chunk"); err != nil {
			return 0, 0, fmt.Errorf("update counter %s: %w", name, err)
		}
	}
	type notHit struct {
		key             string
		present, locked bool
		// created: a create_missing counter's statement created the
		// key's row (counter.createFlush).
		created bool
	}
	rows, err := tx.Query(ctx, b.t.Flush, append([]any{keys, deltas}, b.t.FlushArgs...)...)
	var res []notHit
	if err == nil {
		res, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (notHit, error) {
			var n notHit
			if creates {
				return n, row.Scan(&n.key, &n.present, &n.locked, &n.created)
			}
			err := row.Scan(&n.key, &n.present, &n.locked)
			return n, err
		})
	}
	if err != nil && creates && isLockTimeout(err) {
		for _, q := range []string{"ROLLBACK TO SAVEPOINT walcount_chunk", "RELEASE SAVEPOINT walcount_chunk"} {
			if _, rerr := tx.Exec(ctx, q); rerr != nil {
				return 0, 0, fmt.Errorf("update counter %s: %w (after %v)", name, rerr, err)
			}
		}
		if len(keys) == 1 {
			c := state.Carried{Counter: name, Key: keys[0], Delta: deltas[0]}
			if p, ok := f.prior[counter.Field(name, keys[0])]; ok {
				c.Since = p.Since
			}
			out.carry = append(out.carry, c)
			return 0, 0, nil
		}
		mid := len(keys) / 2
		n1, d1, err := f.chunk(ctx, tx, b, keys[:mid], deltas[:mid], careful, id, out)
		if err != nil {
			return 0, 0, err
		}
		n2, d2, err := f.chunk(ctx, tx, b, keys[mid:], deltas[mid:], careful, id, out)
		return n1 + n2, d1 + d2, err
	}
	if err != nil {
		if !isDataError(err) {
			return 0, 0, fmt.Errorf("update counter %s: %w", name, err)
		}
		if !careful {
			return 0, 0, &dataError{counter: name, chunk: id, err: err}
		}
		for _, q := range []string{"ROLLBACK TO SAVEPOINT walcount_chunk", "RELEASE SAVEPOINT walcount_chunk"} {
			if _, rerr := tx.Exec(ctx, q); rerr != nil {
				return 0, 0, fmt.Errorf("update counter %s: %w (after %v)", name, rerr, err)
			}
		}
		if len(keys) == 1 {
			f.park(b, keys[0], deltas[0], errorText(err), out)
			return 0, 0, nil
		}
		mid := len(keys) / 2
		n1, d1, err := f.chunk(ctx, tx, b, keys[:mid], deltas[:mid], true, id, out)
		if err != nil {
			return 0, 0, err
		}
		n2, d2, err := f.chunk(ctx, tx, b, keys[mid:], deltas[mid:], true, id, out)
		return n1 + n2, d1 + d2, err
	}
	if guarded {
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT walcount_chunk"); err != nil {
			return 0, 0, fmt.Errorf("update counter %s: %w", name, err)
		}
	}
	skipped := make(map[string]notHit, len(res))
	for _, n := range res {
		skipped[n.key] = n
	}
	for i, k := range keys {
		field := counter.Field(name, k)
		n, ok := skipped[k]
		switch {
		case !ok:
			out.applied[field] = deltas[i]
			flushed++
		case n.created:
			out.applied[field] = deltas[i]
			flushed++
			out.created = append(out.created, createdKey{counter: name, key: k, delta: deltas[i]})
		case n.locked:
			// Locked by this statement and not updated: a BEFORE UPDATE
			// trigger returned NULL for the row.
			f.park(b, k, deltas[i], "the row's UPDATE was skipped (a BEFORE UPDATE trigger returned NULL)", out)
		case n.present:
			// Another transaction holds the row: carried to the next
			// flush.
			c := state.Carried{Counter: name, Key: k, Delta: deltas[i]}
			if p, ok := f.prior[field]; ok {
				c.Since = p.Since
			}
			out.carry = append(out.carry, c)
		default:
			if out.missed == nil {
				out.missed = map[string]bool{}
			}
			out.missed[field] = true
			out.applied[field] = deltas[i]
			dropped++
		}
	}
	return flushed, dropped, nil
}

// errorText is a data error as a parked key records it.
func errorText(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	return err.Error()
}

// park keeps a key whose UPDATE failed on its row's data in
// walcount.carried, to be tried again after ParkRetry.
func (f *Flusher) park(b *attemptBatch, key string, delta int64, msg string, out *outcome) {
	name := b.t.Counter.Name
	field := counter.Field(name, key)
	c := state.Carried{Counter: name, Key: key, Delta: delta, Parked: msg}
	p, was := f.prior[field]
	if was {
		c.Since = p.Since
	}
	out.carry = append(out.carry, c)
	out.parked = append(out.parked, parkedKey{counter: name, key: key, delta: delta, err: msg, newly: !was || p.Parked == ""})
}

// carry writes the keys carried after this flush, and a dirty mark for
// each key parked for the first time (design rule 14: reconciliation
// repairs it once it can be written).
func (f *Flusher) carry(ctx context.Context, tx pgx.Tx, out *outcome, loaded []state.Carried) error {
	if err := state.UpdateCarried(ctx, tx, f.opt.Slot, loaded, out.carry, f.opt.ParkRetry); err != nil {
		return err
	}
	byCounter := map[string][]string{}
	causes := map[string]string{}
	for _, p := range out.parked {
		if p.newly {
			byCounter[p.counter] = append(byCounter[p.counter], p.key)
			causes[p.counter] = p.err
		}
	}
	for name, keys := range byCounter {
		cause := "a flush could not write the key: " + causes[name]
		if err := state.MarkDirty(ctx, tx, f.opt.Slot, name, keys, cause); err != nil {
			return err
		}
	}
	// A count that starts a created row below zero proves the source
	// holds rows of the key that no row counted (rows older than the
	// counter's backfill, or than the app's delete of the target row):
	// the row is created, and its key is marked dirty for every
	// create_missing counter of the target in the same transaction, so
	// that reconciliation sets each of its columns to the true value.
	created := map[string]bool{}
	for _, c := range out.created {
		if t := f.targets[c.counter]; t != nil {
			created[t.Counter.Target+"\x00"+c.key] = true
		}
	}
	short := map[string][]string{}
	var names []string
	for field, n := range out.applied {
		name, key, _ := counter.SplitField(field)
		t := f.targets[name]
		if n >= 0 || t == nil || t.Counter.Sum != "" || out.missed[field] || !created[t.Counter.Target+"\x00"+key] {
			continue
		}
		for _, o := range f.targets {
			if !o.Counter.CreateMissing || o.Counter.Target != t.Counter.Target || slices.Contains(short[o.Counter.Name], key) {
				continue
			}
			if _, seen := short[o.Counter.Name]; !seen {
				names = append(names, o.Counter.Name)
			}
			short[o.Counter.Name] = append(short[o.Counter.Name], key)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		slices.Sort(short[name])
		cause := "a flush created the target row with a negative count: the source has rows of the key that walcount never counted"
		if err := state.MarkDirty(ctx, tx, f.opt.Slot, name, short[name], cause); err != nil {
			return err
		}
	}
	return nil
}

// markInheritedMoves marks both ends of each lifecycle move of a batch an
// earlier session buffered dirty (see Inherit).
func (f *Flusher) markInheritedMoves(ctx context.Context, tx pgx.Tx, moves []counter.Move) error {
	byCounter := map[string][]string{}
	var names []string
	for _, m := range moves {
		for _, field := range []string{m.Field, m.To} {
			name, key, ok := counter.SplitField(field)
			if !ok {
				continue // "": the row was deleted
			}
			if _, seen := byCounter[name]; !seen {
				names = append(names, name)
			}
			if !slices.Contains(byCounter[name], key) {
				byCounter[name] = append(byCounter[name], key)
			}
		}
	}
	for _, name := range names {
		const cause = "a target row changed after a flush that walcount restarted before following"
		if err := state.MarkDirty(ctx, tx, f.opt.Slot, name, byCounter[name], cause); err != nil {
			return err
		}
		f.log.Warn("keys marked dirty: a target row was deleted or re-keyed in what an earlier session buffered, which may have crossed one of its flushes; reconciliation will measure them",
			zap.String("counter", name), zap.Int("keys", len(byCounter[name])))
	}
	return nil
}

// committedCarry counts what a committed flush applied and logs what it
// parked.
func (f *Flusher) committedCarry(out *outcome) {
	for _, c := range out.counts {
		f.opt.Metrics.DeltasFlushed.WithLabelValues(c.counter).Add(float64(c.flushed))
		if c.extremum {
			f.opt.Metrics.ExtremumRecomputes.WithLabelValues(c.counter).Add(float64(c.flushed))
		}
		f.opt.Tally.Add(c.counter, counter.TallyFlushed, c.flushed)
		if c.dropped > 0 {
			// The target rows went away; the Rails buffer pattern drops
			// these deltas too.
			f.opt.Metrics.DeltasDropped.WithLabelValues(c.counter).Add(float64(c.dropped))
			f.opt.Tally.Add(c.counter, counter.TallyDropped, c.dropped)
		}
	}
	for _, c := range out.created {
		f.opt.Metrics.TargetRowsCreated.WithLabelValues(c.counter).Inc()
	}
	for _, p := range out.parked {
		if p.newly {
			f.log.Error("a counter key cannot be written and is parked: the other keys go on; it is retried every "+f.opt.ParkRetry.String()+
				" and repaired by reconciliation once it can be written",
				zap.String("counter", p.counter), zap.String("key", p.key), zap.Int64("delta", p.delta), zap.String("error", p.err))
		} else {
			f.log.Warn("a parked counter key still cannot be written",
				zap.String("counter", p.counter), zap.String("key", p.key), zap.Int64("delta", p.delta), zap.String("error", p.err))
		}
	}
	for field, p := range f.prior {
		if _, ok := out.applied[field]; !ok || out.missed[field] {
			continue
		}
		// A carried delta's transactions committed before it was first
		// carried: the time since is a lower bound of their apply lag,
		// which the freshness figures must show.
		f.opt.Metrics.ApplyLag.Observe(max(time.Since(p.Since), 0).Seconds())
		if p.Parked != "" {
			f.log.Info("a parked counter key was written", zap.String("counter", p.Counter), zap.String("key", p.Key))
		}
	}
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
	from := f.w
	if _, err := f.apply(ctx, from, end, fields, nil, resets, false); err != nil {
		return err
	}
	if err := f.opt.Buffer.Advance(ctx, from, end); err != nil {
		return err
	}
	f.committed(end)
	f.log.Info("applied truncate barrier", zap.Strings("counters", reset), zap.String("lsn", end.String()))
	return nil
}
