package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/events"
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
	// Events publishes the change events of the keys each flush
	// changes; nil publishes none.
	Events *events.Publisher
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
	// RowSecurityOff runs the flush transactions with row_security = off:
	// set when no row-level security policy applies to walcount's role on
	// any counter's tables, so that a policy enabled while the flusher
	// runs makes the flush fail (ErrPartialView) instead of taking a row
	// it hides for a deleted one and dropping its deltas.
	RowSecurityOff bool
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

// begin opens a flush transaction with walcount's own bounds, whatever the
// database or the role set: a flush waits for no row lock (it skips
// them), for a table lock at most lock_timeout, and never sits idle
// holding row locks. statement is the statement_timeout.
func (f *Flusher) begin(ctx context.Context, statement time.Duration) (pgx.Tx, error) {
	tx, err := f.opt.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin flush: %w", err)
	}
	rowSecurity := "on"
	if f.opt.RowSecurityOff {
		rowSecurity = "off"
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true),
set_config('idle_in_transaction_session_timeout', $3, true), set_config('row_security', $4, true)`,
		ms(f.opt.LockTimeout), ms(statement), ms(f.opt.IdleTimeout), rowSecurity); err != nil {
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

// committed records a new W and hands it on.
func (f *Flusher) committed(w cdc.LSN) {
	f.w = w
	f.opt.FlushLog.prune(w)
	f.lastFlush = time.Now()
	f.opt.Metrics.CheckpointLSN.Set(float64(w))
	if !f.drainDue {
		f.lagApplied()
	}
	if f.opt.Ack != nil {
		f.opt.Ack(w)
	}
}

// lagApplied observes the apply lag of the transactions up to W: their
// deltas are in the counter columns. Not while a drain is due: a W that a
// staging transaction moved (flushBig) holds deltas that are still in
// walcount.carried, to be applied piece by piece, and the lag of its
// transactions goes on until the drain's last piece committed.
func (f *Flusher) lagApplied() {
	if f.opt.Lag != nil {
		f.opt.Lag.Applied(f.w, time.Now(), f.opt.Metrics.ApplyLag)
	}
}

// ms renders a duration as a PostgreSQL setting in milliseconds.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
