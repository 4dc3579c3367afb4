package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/state"
)

// Defaults of Options.
const (
	// DefaultStepTimeout bounds each wait of a measurement: for M0 to be
	// seen, for W to pass it, and for M1.
	DefaultStepTimeout = 30 * time.Second
	// DefaultBatchSize is how many target keys one measurement reads: a
	// range a full run surveys in one query, or keys of a run limited to
	// some keys, read one by one.
	DefaultBatchSize = 100_000
	// DefaultInterval is the pause between scheduled full
	// reconciliations.
	DefaultInterval = 24 * time.Hour
	// DefaultLease is how long a claimed run stays this daemon's without
	// a word from it; every batch renews it. A daemon that dies leaves the
	// run to another once it expires.
	DefaultLease = 2 * time.Minute
	// DefaultPoll is how often the reconciler looks for runs queued by
	// another walcount and for dirty counters to repair.
	DefaultPoll = 2 * time.Second
	// DefaultMaxAttempts is how often a batch is measured again after a
	// session restart or a timeout before the run fails.
	DefaultMaxAttempts = 20
)

var (
	// ErrBusy is returned by Start while a run is in progress.
	ErrBusy = errors.New("a reconciliation is already running")
	// ErrUnknownCounter is returned by Start for a counter name that is
	// not configured.
	ErrUnknownCounter = errors.New("no such counter")
	// ErrNotStreaming is returned by a FlushFunc while no replication
	// session runs.
	ErrNotStreaming = errors.New("walcount is not streaming")
	// ErrBadRequest is returned by Start for a request it cannot run.
	ErrBadRequest = errors.New("bad reconciliation request")
)

// FlushFunc asks the running session to flush now.
type FlushFunc func(ctx context.Context) error

// Options configure a Reconciler.
type Options struct {
	Pool     *pgxpool.Pool
	Slot     string
	Counters []counter.Counter
	// BatchSize is the number of keys per measurement; default
	// DefaultBatchSize.
	BatchSize int
	// MaxKeysPerSecond paces runs: at most that many keys are read per
	// second, and a measurement reads at most that many. 0 means no limit.
	// A run started with a limit of its own keeps to that one instead.
	MaxKeysPerSecond int
	// Clock is the pacing's time; nil means the wall clock.
	Clock Clock
	// Interval between scheduled runs; 0 disables them.
	Interval time.Duration
	// Backfill runs a full reconciliation of counters that are new or
	// changed since the last backfill.
	Backfill bool
	// Flush makes the session flush at once, so that W passes a marker
	// without waiting for the flush interval.
	Flush FlushFunc
	// Busy reports that the stream is behind; the reconciler pauses
	// between batches while it is, so it never starves the stream.
	Busy func() bool
	// Streaming reports whether this daemon streams from the slot: only
	// the streaming daemon executes runs, whoever queued them. Nil means
	// always.
	Streaming func() bool
	// Keepable reports whether a counter can be kept from the stream
	// again (its replica identity carries what it reads): a dirty counter
	// is reconciled only then. Nil means always.
	Keepable func(counter string) bool
	// Owner names this daemon in the runs it claims; empty draws one.
	Owner string
	// Lease: default DefaultLease. Poll: default DefaultPoll.
	Lease time.Duration
	Poll  time.Duration
	// Failpoints are armed by crash tests; nil in production.
	Failpoints *failpoint.Set
	// StepTimeout: default DefaultStepTimeout. It bounds a wait in which
	// the stream made no progress (see Progress), not the wait itself.
	StepTimeout time.Duration
	// Progress, when set, returns the stream's received position: a
	// wait is cut short only after StepTimeout without that position
	// moving, so that a standby that decodes and applies the primary's
	// WAL late (replay lag) delays a measurement, never fails it.
	Progress func() cdc.LSN
	Metrics  *metrics.Metrics
	// Tally, when not nil, counts the corrections applied per counter
	// for /status.
	Tally  *counter.Tally
	Logger *zap.Logger
}

// Request is an on-demand run.
type Request struct {
	// Counter limits the run to one counter; empty means all.
	Counter   string `json:"counter"`
	DryRun    bool   `json:"dry_run"`
	BatchSize int    `json:"batch_size"`
	// MaxKeysPerSecond paces this run; nil means the daemon's
	// reconcile.max_keys_per_second, 0 no limit.
	MaxKeysPerSecond *int `json:"max_keys_per_second,omitempty"`
}

// Reconciler runs reconciliations inside the daemon: scheduled, on
// demand, and backfills; one at a time, resumable after a restart.
type Reconciler struct {
	opt  Options
	log  *zap.Logger
	rec  *Recorder
	runs state.Runs
	seq  int64
	kick chan struct{}

	mu      sync.Mutex
	current *RunInfo
	last    *RunInfo
	ready   bool
	// rates are the limits of runs started here with one of their own,
	// by run id. They are not stored with the run: a run resumed after a
	// restart, or executed by another walcount, keeps to that walcount's
	// MaxKeysPerSecond.
	rates map[int64]int
	// unseen holds the dirty counters queueDirty found hidden by row-level
	// security and warned about. It belongs to Run's goroutine.
	unseen map[string]bool
	// backfillHidden is set when a backfill failed because row-level
	// security hid rows; it is queued again once they can be seen. It
	// belongs to Run's goroutine.
	backfillHidden bool
	// backfillDeferred is set when new counters waited for an unfinished
	// run: their backfill is queued once no run is left unfinished.
	backfillDeferred bool
	// forgotten is set once the state of the counters no longer
	// configured was deleted (forget). It belongs to Run's goroutine.
	forgotten bool
}

// New returns a Reconciler. Its Recorder must be wired into the
// aggregator.
func New(opt Options) *Reconciler {
	if opt.BatchSize <= 0 {
		opt.BatchSize = DefaultBatchSize
	}
	if opt.StepTimeout <= 0 {
		opt.StepTimeout = DefaultStepTimeout
	}
	if opt.Lease <= 0 {
		opt.Lease = DefaultLease
	}
	if opt.Poll <= 0 {
		opt.Poll = DefaultPoll
	}
	if opt.Owner == "" {
		host, _ := os.Hostname()
		opt.Owner = fmt.Sprintf("%s/%d/%x", host, os.Getpid(), rand.Uint32())
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	return &Reconciler{
		opt:    opt,
		log:    opt.Logger,
		rec:    NewRecorder(opt.Slot, opt.Logger),
		runs:   state.NewRuns(opt.Pool, opt.Slot),
		kick:   make(chan struct{}, 1),
		rates:  map[int64]int{},
		unseen: map[string]bool{},
	}
}

// rate returns the keys per second run id keeps to (0: no limit).
func (r *Reconciler) rate(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.rates[id]; ok {
		return n
	}
	return r.opt.MaxKeysPerSecond
}

// Recorder returns the stream-side part.
func (r *Reconciler) Recorder() *Recorder { return r.rec }

// Status is the reconciliation state shown in /status.
type Status struct {
	Current *RunInfo `json:"current,omitempty"`
	Last    *RunInfo `json:"last,omitempty"`
}

// Status returns the current and the last finished run.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s Status
	if r.current != nil {
		c := *r.current
		c.Drift = slices.Clone(c.Drift)
		s.Current = &c
	}
	if r.last != nil {
		l := *r.last
		s.Last = &l
	}
	return s
}

// RunView is one run as GET /v1/reconcile/{id} shows it.
type RunView struct {
	RunInfo
	// ExecutedHere is true when this daemon executes (or executed) the
	// run; a run queued through a standby is executed by the walcount of
	// the slot that streams, Owner.
	ExecutedHere bool `json:"executed_here"`
	// Streaming says whether this daemon streams, and so may execute runs.
	Streaming bool `json:"streaming"`
}

// Lookup returns run id: this daemon's view while it executes it or
// executed it last (with its drift samples), else the record of the
// slot's runs, which any walcount of the slot may be executing.
func (r *Reconciler) Lookup(ctx context.Context, id int64) (RunView, bool, error) {
	st := r.Status()
	for _, run := range []*RunInfo{st.Current, st.Last} {
		if run != nil && run.ID == id {
			return RunView{RunInfo: *run, ExecutedHere: true, Streaming: r.streaming()}, true, nil
		}
	}
	run, ok, err := r.runs.Get(ctx, id)
	if err != nil || !ok {
		return RunView{}, ok, err
	}
	return RunView{RunInfo: run, ExecutedHere: run.Owner == r.opt.Owner, Streaming: r.streaming()}, true, nil
}

// Start queues an on-demand run and returns it. Any walcount of the slot
// accepts it; the one that streams executes it.
func (r *Reconciler) Start(ctx context.Context, req Request) (RunInfo, error) {
	r.mu.Lock()
	busy, ready := r.current != nil, r.ready
	r.mu.Unlock()
	if !ready {
		return RunInfo{}, fmt.Errorf("start reconciliation: %w", ErrNotStreaming)
	}
	if busy {
		return RunInfo{}, ErrBusy
	}
	if _, ok, err := r.runs.Unfinished(ctx); err != nil {
		return RunInfo{}, err
	} else if ok {
		return RunInfo{}, ErrBusy
	}
	var names []string
	for _, c := range r.opt.Counters {
		if req.Counter == "" || req.Counter == c.Name {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return RunInfo{}, fmt.Errorf("%w: %q", ErrUnknownCounter, req.Counter)
	}
	if req.MaxKeysPerSecond != nil && *req.MaxKeysPerSecond < 0 {
		return RunInfo{}, fmt.Errorf("%w: max_keys_per_second must not be negative", ErrBadRequest)
	}
	batch := req.BatchSize
	if batch <= 0 {
		batch = r.opt.BatchSize
	}
	run, err := r.runs.Create(ctx, state.KindManual, names, req.DryRun, batch)
	if err != nil {
		return RunInfo{}, fmt.Errorf("create reconcile run: %w", err)
	}
	if req.MaxKeysPerSecond != nil {
		r.mu.Lock()
		r.rates[run.ID] = *req.MaxKeysPerSecond
		r.mu.Unlock()
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return run, nil
}

// Run executes runs until ctx is done: it resumes an unfinished run,
// backfills new counters, repairs dirty ones, then waits for requests
// (its own or queued through another walcount) and the schedule. It
// executes runs only while this daemon streams.
func (r *Reconciler) Run(ctx context.Context) error {
	if err := r.waitStore(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	r.ready = true
	r.mu.Unlock()
	if r.streaming() {
		r.forget(ctx)
	}
	if r.opt.Backfill {
		if err := r.backfill(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("backfill failed", zap.Error(err))
		}
	}
	poll := time.NewTicker(r.opt.Poll)
	defer poll.Stop()
	defer func() {
		// A clean stop hands the runs it held to the next walcount at
		// once; after a crash, the next one to stream takes them over.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := r.runs.Release(rctx, r.opt.Owner); err != nil {
			r.log.Debug("cannot release reconcile runs", zap.Error(err))
		}
	}()
	for {
		if r.streaming() && !r.forgotten && r.forget(ctx) && r.opt.Backfill {
			// A counter added back had a backfill record until now.
			if err := r.backfill(ctx); err != nil && ctx.Err() == nil {
				r.log.Error("backfill failed", zap.Error(err))
			}
		}
		if r.streaming() && r.backfillHidden {
			if err := r.retryBackfill(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("cannot queue the backfill again", zap.Error(err))
			}
		}
		if r.streaming() {
			if err := r.queueDirty(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("cannot queue the repair of dirty counters", zap.Error(err))
			}
			err := r.runPending(ctx)
			if err == nil && r.backfillDeferred && !r.backfillHidden {
				// The runs that were unfinished at start are done.
				if err = r.backfill(ctx); err == nil {
					err = r.runPending(ctx)
				}
			}
			if err != nil && ctx.Err() == nil {
				if errors.Is(err, failpoint.ErrCrash) {
					return err
				}
				r.log.Error("reconciliation failed", zap.Error(err))
			}
		}
		var timer <-chan time.Time
		if r.opt.Interval > 0 {
			last, ok, err := r.runs.LastFinished(ctx)
			wait := r.opt.Interval
			if err == nil && ok {
				wait = time.Until(last.Add(r.opt.Interval))
			}
			timer = time.After(max(wait, time.Second))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-poll.C:
		case <-timer:
			if _, err := r.runs.Create(ctx, state.KindScheduled, r.names(), false, r.opt.BatchSize); err != nil && ctx.Err() == nil {
				r.log.Error("schedule reconciliation", zap.Error(err))
			}
		}
	}
}

func (r *Reconciler) streaming() bool { return r.opt.Streaming == nil || r.opt.Streaming() }

// waitStore waits until walcount's state schema is there, in the version
// this walcount knows, retrying while PostgreSQL is away.
func (r *Reconciler) waitStore(ctx context.Context) error {
	for {
		err := state.CheckVersion(ctx, r.opt.Pool)
		if err == nil {
			return nil
		}
		r.log.Debug("reconcile store not ready", zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (r *Reconciler) names() []string {
	var out []string
	for _, c := range r.opt.Counters {
		out = append(out, c.Name)
	}
	return out
}

func (r *Reconciler) counter(name string) (counter.Counter, bool) {
	for _, c := range r.opt.Counters {
		if c.Name == name {
			return c, true
		}
	}
	return counter.Counter{}, false
}
