package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
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

// queueDirty queues the repair of dirty counters that can be kept again:
// one run per counter, over its dirty keys, or all its keys when the whole
// counter is dirty. The run clears the marks it was made for once done.
func (r *Reconciler) queueDirty(ctx context.Context) error {
	marks, err := state.ListDirty(ctx, r.opt.Pool, r.opt.Slot)
	if err != nil || len(marks) == 0 {
		return err
	}
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		return err // one run at a time; the marks wait for the next turn
	}
	type repair struct {
		all  bool
		keys []string
		ids  []int64
	}
	by := map[string]*repair{}
	var order []string
	hidden := map[string]bool{} // by counter, read once per call
	for _, m := range marks {
		if _, ok := r.counter(m.Counter); !ok {
			// The counter left the configuration: nothing to repair.
			if err := state.ClearDirty(ctx, r.opt.Pool, []int64{m.ID}); err != nil {
				return err
			}
			continue
		}
		if r.opt.Keepable != nil && !r.opt.Keepable(m.Counter) {
			continue
		}
		h, read := hidden[m.Counter]
		if !read {
			if h, err = r.hidden(ctx, m.Counter); err != nil {
				return err
			}
			hidden[m.Counter] = h
		}
		if h {
			continue // stays dirty, and listed as such, until its rows can be seen
		}
		rp := by[m.Counter]
		if rp == nil {
			rp = &repair{}
			by[m.Counter] = rp
			order = append(order, m.Counter)
		}
		rp.ids = append(rp.ids, m.ID)
		if m.Key == nil {
			rp.all = true
		} else if !slices.Contains(rp.keys, *m.Key) {
			rp.keys = append(rp.keys, *m.Key)
		}
	}
	for _, name := range order {
		rp := by[name]
		run := RunInfo{Kind: state.KindDirty, Counters: []string{name}, BatchSize: r.opt.BatchSize, DirtyIDs: rp.ids}
		if !rp.all {
			slices.Sort(rp.keys)
			run.Keys = rp.keys
		}
		if _, err := r.runs.CreateFor(ctx, run); err != nil {
			return err
		}
		r.log.Info("repairing a dirty counter", zap.String("counter", name), zap.Bool("every_key", rp.all), zap.Int("keys", len(rp.keys)))
	}
	return nil
}

// hidden reports whether row-level security hides rows of the counter's
// tables from walcount's role. It logs why the first time it does, and
// again only after they could be seen meanwhile.
func (r *Reconciler) hidden(ctx context.Context, name string) (bool, error) {
	c, _ := r.counter(name)
	err := counter.CheckRowViews(ctx, r.opt.Pool, c)
	if err == nil {
		delete(r.unseen, name)
		return false, nil
	}
	if !errors.Is(err, counter.ErrPartialView) {
		return false, err
	}
	if !r.unseen[name] {
		r.unseen[name] = true
		r.log.Warn("a dirty counter is not repaired: row-level security hides rows of its tables from walcount's role, so no correction can be measured; it stays dirty",
			zap.String("counter", name), zap.Error(err))
	}
	return true, nil
}

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

// forget deletes what the slot keeps for counters that left the
// configuration (state.Runs.Forget), once, before their backfill records
// could make a counter added back look backfilled. Only the daemon that
// streams forgets: a standby started with a new configuration must not
// delete the carried deltas of counters the active daemon still keeps.
// It reports whether it forgot a backfill record the backfill that ran
// before it may have read.
func (r *Reconciler) forget(ctx context.Context) bool {
	forgot, err := r.runs.Forget(ctx, r.opt.Pool, r.names())
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("cannot forget the counters removed from the configuration; trying again", zap.Error(err))
		}
		return false
	}
	r.forgotten = true
	if len(forgot) > 0 {
		r.log.Info("forgot the state of counters removed from the configuration (backfill records, dirty marks, partitions, carried deltas)",
			zap.Strings("counters", forgot))
	}
	return len(forgot) > 0
}

// backfill reconciles the counters that are new or changed, so adding
// walcount to a table that already has rows makes the counts exact.
func (r *Reconciler) backfill(ctx context.Context) error {
	names, err := r.runs.NeedBackfill(ctx, r.opt.Counters)
	if err != nil || len(names) == 0 {
		return err
	}
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		// An unfinished run resumes first; the backfill is queued once
		// it is done (Run asks again).
		r.backfillDeferred = err == nil
		return err
	}
	r.backfillDeferred = false
	names = BackfillOrder(r.opt.Counters, names)
	r.log.Info("backfilling new counters", zap.Strings("counters", names))
	var queued []counter.Counter
	for _, name := range names {
		if c, ok := r.counter(name); ok {
			queued = append(queued, c)
		}
	}
	if err := r.runs.BackfillQueued(ctx, queued); err != nil {
		return err
	}
	if _, err := r.runs.Create(ctx, state.KindBackfill, names, false, r.opt.BatchSize); err != nil {
		return err
	}
	return nil
}

// retryBackfill queues the backfill again once row-level security, which
// failed the last one, lets walcount's role see every row of the counters
// that still need it.
func (r *Reconciler) retryBackfill(ctx context.Context) error {
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		return err // one run at a time: ask again at the next poll
	}
	names, err := r.runs.NeedBackfill(ctx, r.opt.Counters)
	if err != nil {
		return err
	}
	for _, name := range names {
		c, _ := r.counter(name)
		if err := counter.CheckRowViews(ctx, r.opt.Pool, c); err != nil {
			if errors.Is(err, counter.ErrPartialView) {
				return nil // still hidden: ask again at the next poll
			}
			return err
		}
	}
	r.backfillHidden = false
	return r.backfill(ctx)
}

// runPending claims and executes every pending or interrupted run, oldest
// first, while this daemon streams.
func (r *Reconciler) runPending(ctx context.Context) error {
	for ctx.Err() == nil && r.streaming() {
		// The daemon that streams takes over a run a daemon that lost
		// the slot held (state.Runs.Claim).
		run, ok, err := r.runs.Claim(ctx, r.opt.Owner, r.opt.Lease, r.opt.Streaming != nil)
		if err != nil || !ok {
			return err
		}
		if err := r.execute(ctx, run); err != nil {
			if errors.Is(err, state.ErrLeaseLost) {
				r.log.Warn("another walcount took the reconciliation run over", zap.Int64("run", run.ID))
				r.finish(run)
				continue
			}
			return err
		}
	}
	return nil
}

// execute runs one reconciliation to its end, saving progress after
// every batch.
func (r *Reconciler) execute(ctx context.Context, run RunInfo) error {
	start := time.Now()
	resumed := run.Status == state.StatusRunning
	// A count through row-level security that hides rows is a count of
	// what the policies let through: refuse before anything is measured
	// or written (docs/design.md, "Row-level security").
	for _, name := range run.Counters {
		if c, ok := r.counter(name); ok {
			if err := counter.CheckRowViews(ctx, r.opt.Pool, c); err != nil {
				if ctx.Err() != nil {
					return nil // resumes after restart
				}
				if run.Kind == state.KindBackfill && errors.Is(err, counter.ErrPartialView) {
					r.backfillHidden = true
				}
				return r.fail(ctx, run, err)
			}
		}
	}
	run.Status = state.StatusRunning
	if !resumed && run.Keys != nil {
		run.Total = int64(len(run.Keys))
	} else if !resumed {
		run.Total = 0
		for _, name := range run.Counters {
			if c, ok := r.counter(name); ok {
				sql, err := counter.Resolve(ctx, r.opt.Pool, c)
				if err != nil {
					return r.fail(ctx, run, err)
				}
				var n int64
				if err := r.opt.Pool.QueryRow(ctx, sql.Total).Scan(&n); err != nil {
					return r.fail(ctx, run, fmt.Errorf("count target rows: %w", err))
				}
				run.Total += n
			}
		}
	}
	r.setCurrent(&run)
	r.log.Info("reconciliation started", zap.Int64("run", run.ID), zap.String("kind", run.Kind),
		zap.Strings("counters", run.Counters), zap.Bool("dry_run", run.DryRun), zap.Bool("resumed", resumed),
		zap.Int64("total_keys", run.Total))
	if err := r.runs.Progress(ctx, run, r.opt.Lease); err != nil {
		return err
	}
	startIdx := 0
	if run.CurCounter != "" {
		if i := slices.Index(run.Counters, run.CurCounter); i >= 0 {
			startIdx = i
		}
	}
	for _, name := range run.Counters[startIdx:] {
		c, ok := r.counter(name)
		if !ok {
			return r.fail(ctx, run, fmt.Errorf("%w: %q is not configured any more", ErrUnknownCounter, name))
		}
		if run.CurCounter != name {
			run.CurCounter, run.LastKey = name, ""
		} else if err := r.remeasureChanged(ctx, &run, c); err != nil {
			return r.fail(ctx, run, err)
		}
		if err := r.reconcileCounter(ctx, &run, c); err != nil {
			if ctx.Err() != nil {
				return nil // resumes after restart
			}
			if errors.Is(err, state.ErrLeaseLost) || errors.Is(err, failpoint.ErrCrash) {
				return err
			}
			return r.fail(ctx, run, err)
		}
		if run.Kind == state.KindBackfill && !run.DryRun {
			if err := r.runs.Backfilled(ctx, c); err != nil {
				return r.fail(ctx, run, err)
			}
		}
	}
	run.Status = state.StatusDone
	now := time.Now()
	run.FinishedAt = &now
	if err := r.runs.Progress(ctx, run, r.opt.Lease); err != nil {
		return err
	}
	if len(run.DirtyIDs) > 0 && !run.DryRun {
		if err := state.ClearDirty(ctx, r.opt.Pool, run.DirtyIDs); err != nil {
			return err
		}
		r.log.Info("dirty counter repaired", zap.Strings("counters", run.Counters), zap.Int64("corrected", run.Corrected))
	}
	r.finish(run)
	r.prune(ctx)
	r.log.Info("reconciliation done", zap.Int64("run", run.ID), zap.Int64("keys_checked", run.KeysChecked),
		zap.Int64("drifted", run.Drifted), zap.Int64("corrected", run.Corrected), zap.Duration("took_seconds", time.Since(start)))
	return nil
}

// remeasureChanged starts the counter a resumed backfill stopped in over
// from its first key when the counter's definition changed since the
// backfill was queued: the keys measured before the stop were measured
// with the old definition, and the backfill's end records the new one as
// backfilled.
func (r *Reconciler) remeasureChanged(ctx context.Context, run *RunInfo, c counter.Counter) error {
	if run.Kind != state.KindBackfill || run.LastKey == "" {
		return nil
	}
	changed, err := r.runs.DefinitionChanged(ctx, c)
	if err != nil || !changed {
		return err
	}
	r.log.Info("the counter's definition changed since its backfill began: the backfill measures it again from its first key",
		zap.Int64("run", run.ID), zap.String("counter", c.Name), zap.String("stopped_after_key", run.LastKey))
	run.LastKey = ""
	return nil
}

func (r *Reconciler) fail(ctx context.Context, run RunInfo, err error) error {
	if ctx.Err() != nil {
		// The daemon stops (SIGTERM): whatever failed failed because of
		// it. The run stays unfinished, and the walcount that streams
		// next resumes it (Release hands it over).
		r.log.Info("reconciliation interrupted; it resumes when a walcount of the slot streams again",
			zap.Int64("run", run.ID), zap.NamedError("cause", err))
		r.mu.Lock()
		r.current = nil
		r.mu.Unlock()
		return nil
	}
	run.Status = state.StatusFailed
	run.Error = err.Error()
	now := time.Now()
	run.FinishedAt = &now
	if perr := r.runs.Progress(context.WithoutCancel(ctx), run, r.opt.Lease); perr != nil {
		r.log.Error("save failed run", zap.Error(perr))
	}
	r.finish(run)
	r.prune(context.WithoutCancel(ctx))
	return fmt.Errorf("reconcile run %d: %w", run.ID, err)
}

// setCurrent publishes a copy of run: execute keeps changing its own.
func (r *Reconciler) setCurrent(run *RunInfo) {
	c := *run
	r.mu.Lock()
	r.current = &c
	r.mu.Unlock()
}

func (r *Reconciler) update(run *RunInfo, drift []KeyDrift) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil {
		return
	}
	d := r.current.Drift
	for _, k := range drift {
		if len(d) < state.MaxDriftSamples {
			d = append(d, k)
		}
	}
	run.Drift = d
	*r.current = *run
}

// prune keeps the slot's newest state.KeptRuns finished runs and deletes
// the older ones; a failure only costs a longer table until the next run.
func (r *Reconciler) prune(ctx context.Context) {
	if n, err := r.runs.Prune(ctx, state.KeptRuns); err != nil {
		r.log.Warn("could not prune old reconciliation runs", zap.Error(err))
	} else if n > 0 {
		r.log.Debug("pruned old reconciliation runs", zap.Int64("deleted", n), zap.Int("kept", state.KeptRuns))
	}
}

func (r *Reconciler) finish(run RunInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.rates, run.ID)
	if r.current != nil {
		run.Drift = r.current.Drift
	}
	r.current = nil
	r.last = &run
}

// reconcileCounter walks c's keys (all of them, or the run's) in key
// order, in rounds (see pass).
func (r *Reconciler) reconcileCounter(ctx context.Context, run *RunInfo, c counter.Counter) error {
	sql, err := counter.Resolve(ctx, r.opt.Pool, c)
	if err != nil {
		return err
	}
	io := &reconcilerIO{r: r, sql: sql, quiet: quietAbove(run, c)}
	p := &pass{
		io:      io,
		log:     r.log,
		counter: c.Name,
		dry:     run.DryRun,
		size:    run.BatchSize,
		pacer:   NewPacer(r.rate(run.ID), r.opt.Clock),
		keys:    run.Keys,
		run:     run,
	}
	if p.size <= 0 {
		p.size = r.opt.BatchSize
	}
	if run.Keys == nil {
		p.sv = newSurvey(sql, r.opt.Slot)
		if c.IsVia() && !run.DryRun {
			// A full run measures the via rows there are: every parent
			// gets one first (counter.ViaSeedSQL).
			tag, err := r.opt.Pool.Exec(ctx, counter.ViaSeedSQL(c))
			if err != nil {
				return fmt.Errorf("counter %s: seed its via table: %w", c.Name, err)
			}
			if n := tag.RowsAffected(); n > 0 {
				r.log.Info("via rows seeded", zap.Int64("run", run.ID), zap.String("counter", c.Name), zap.Int64("rows", n))
			}
		}
		if sql.Seed != "" && !run.DryRun {
			if err := r.seedTargets(ctx, run, sql); err != nil {
				return err
			}
		}
	}
	p.backfill = run.Kind == state.KindBackfill
	checked, corrected := run.KeysChecked, run.Corrected
	if err := p.execute(ctx); err != nil {
		return err
	}
	// One line per counter: a backfill's corrections are its first count,
	// a reconcile's are drift (WARN when it found any).
	fields := []zap.Field{zap.Int64("run", run.ID), zap.String("counter", c.Name),
		zap.Int64("keys_checked", run.KeysChecked-checked), zap.Int64("corrected", run.Corrected-corrected)}
	switch {
	case p.backfill:
		r.log.Info("counter backfilled", fields...)
	case run.Corrected > corrected:
		r.log.Warn("counter reconciled", append(fields, zap.Int64("not_logged", p.notLogged))...)
	default:
		r.log.Info("counter reconciled", fields...)
	}
	return nil
}

// maxSeedMarks is how many target rows one seed may create before the
// other counters of the target are marked dirty whole instead of key by
// key.
const maxSeedMarks = 10000

// seedTargets gives every key of the create_missing counter sql with
// counted source rows a target row when it has none (counter's
// Resolved.Seed), so that the full run that follows measures it and sets
// its column: without it a key whose source rows predate the counter (or
// whose row the app deleted, or a TRUNCATE emptied) would get no row
// until its rows change again. A row created so holds its declared
// defaults and DEFAULTs in the target's other columns: the other counters
// of the target are marked dirty for those keys in the same transaction
// (the whole counter past maxSeedMarks), and their repair sets them.
func (r *Reconciler) seedTargets(ctx context.Context, run *RunInfo, sql *counter.Resolved) error {
	c := sql.Counter
	tx, err := r.opt.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(ctx, sql.Seed, sql.FilterArgs...)
	if err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	if len(keys) == 0 {
		return nil
	}
	marks := keys
	if len(keys) > maxSeedMarks {
		marks = nil
	}
	cause := fmt.Sprintf("reconciliation of counter %s created target rows for keys with source rows and no row", c.Name)
	for _, o := range r.opt.Counters {
		if o.Name == c.Name || o.Target != c.Target || o.IsVia() {
			continue
		}
		if err := state.MarkDirty(ctx, tx, r.opt.Slot, o.Name, marks, cause); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("counter %s: create missing target rows: %w", c.Name, err)
	}
	r.log.Info("target rows created", zap.Int64("run", run.ID), zap.String("counter", c.Name), zap.Int("rows", len(keys)))
	return nil
}

// reconcilerIO is a pass's way to the stream and the database.
type reconcilerIO struct {
	r   *Reconciler
	sql *counter.Resolved
	// quiet names the level above a via counter that this backfill
	// measures after it: the via counter's corrections are then written
	// into the via table quietly (correctVia).
	quiet string
}

var _ passIO = (*reconcilerIO)(nil)

func (io *reconcilerIO) measure(ctx context.Context, rq *roundRequest) (roundResult, error) {
	return io.r.measureRetrying(ctx, io.sql, rq)
}

func (io *reconcilerIO) emit(ctx context.Context, drift []KeyDrift) (cdc.LSN, error) {
	if io.quiet != "" {
		return io.r.correctVia(ctx, io.sql, io.quiet, drift)
	}
	return io.r.emitCorrections(ctx, drift)
}

func (io *reconcilerIO) applied(ctx context.Context, lsn cdc.LSN) error {
	return io.r.waitCheckpoint(ctx, lsn, nil)
}

func (io *reconcilerIO) progress(ctx context.Context, run *RunInfo, drift []KeyDrift) error {
	io.r.update(run, drift)
	return io.r.runs.Progress(ctx, *run, io.r.opt.Lease)
}

func (io *reconcilerIO) checked(keys, corrected int) {
	name := io.sql.Counter.Name
	if keys > 0 {
		io.r.opt.Metrics.ReconcileKeysChecked.WithLabelValues(name).Add(float64(keys))
	}
	if corrected > 0 {
		io.r.opt.Metrics.ReconcileCorrections.WithLabelValues(name).Add(float64(corrected))
		io.r.opt.Tally.Add(name, counter.TallyCorrections, int64(corrected))
	}
}

func (io *reconcilerIO) idle(ctx context.Context) { io.r.pace(ctx) }

// nextKeys returns up to n of the sorted keys after last ("" for the
// first).
func nextKeys(keys []string, last string, n int) []string {
	i := 0
	if last != "" {
		i, _ = slices.BinarySearch(keys, last)
		if i < len(keys) && keys[i] == last {
			i++
		}
	}
	return keys[i:min(i+n, len(keys))]
}

// pace waits while the stream is behind, so reconciliation never starves
// it.
func (r *Reconciler) pace(ctx context.Context) {
	if r.opt.Busy == nil {
		return
	}
	for i := 0; i < 50 && r.opt.Busy(); i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// maxCorrectionsPerMessage bounds the corrections one message carries, so
// that a backfill's many corrections travel in messages of a few hundred
// kilobytes each.
const maxCorrectionsPerMessage = 10_000

// emitCorrections carries corrections through the WAL: a transactional
// message holds them, the stream turns it into deltas of its transaction,
// and they are flushed exactly once with everything else, even when
// walcount crashes before that flush and the stream is replayed. It
// returns a position past the messages: the corrections count as applied
// only once W has passed it, so a run's figures never claim a correction
// that is not in the counter columns.
func (r *Reconciler) emitCorrections(ctx context.Context, drift []KeyDrift) (cdc.LSN, error) {
	for chunk := range slices.Chunk(drift, maxCorrectionsPerMessage) {
		c := correction{Correct: make(map[string]int64, len(chunk)), Slot: r.opt.Slot}
		for _, d := range chunk {
			c.Correct[counter.Field(d.Counter, d.Key)] = d.Correction
		}
		content, err := json.Marshal(c)
		if err != nil {
			return 0, err
		}
		if err := cdc.PostMessage(ctx, r.opt.Pool, string(content)); err != nil {
			return 0, fmt.Errorf("emit corrections: %w", err)
		}
		if err := r.opt.Failpoints.Inject(failpoint.AfterCorrection); err != nil {
			return 0, err
		}
	}
	// The messages' transactions end before the server's insert position
	// read after they committed.
	var end cdc.LSN
	if err := r.opt.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
		return 0, fmt.Errorf("read the position of the corrections: %w", err)
	}
	return end, nil
}

// correctVia writes a backfill's corrections of a via counter straight
// into its via table, in transactions that each open with a trusted quiet
// message naming top, the level above (cdc.QuietMessage): the aggregator
// counts nothing of their changes for top. top was counted before
// walcount (an app's triggers kept it exact, which its via table was not
// yet), so carrying these corrections up as deltas would count them twice,
// and measuring top before them would "correct" it against a via table
// not filled yet; its own backfill comes after and measures it against
// the via rows as they are then (docs/design.md §5, "Backfill order").
// The corrections are in the via table once their transaction commits;
// a key whose via row is gone (collected meanwhile) is corrected through
// the WAL instead, as emitCorrections does. It returns a position past
// the transactions, as emitCorrections does.
func (r *Reconciler) correctVia(ctx context.Context, sql *counter.Resolved, top string, drift []KeyDrift) (cdc.LSN, error) {
	quiet := cdc.QuietMessage(r.opt.Slot, []string{top})
	for chunk := range slices.Chunk(drift, maxCorrectionsPerMessage) {
		keys := make([]string, len(chunk))
		deltas := make([]int64, len(chunk))
		for i, d := range chunk {
			keys[i], deltas[i] = d.Key, d.Correction
		}
		err := pgx.BeginFunc(ctx, r.opt.Pool, func(tx pgx.Tx) error {
			// The message first: the aggregator reads it before the
			// changes it covers.
			if err := cdc.PostMessage(ctx, tx, quiet); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, sql.Correct, keys, deltas)
			if err != nil {
				return err
			}
			missed, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(missed) == 0 {
				return err
			}
			c := correction{Correct: make(map[string]int64, len(missed)), Slot: r.opt.Slot}
			for _, d := range chunk {
				if slices.Contains(missed, d.Key) {
					c.Correct[counter.Field(d.Counter, d.Key)] = d.Correction
				}
			}
			content, err := json.Marshal(c)
			if err != nil {
				return err
			}
			return cdc.PostMessage(ctx, tx, string(content))
		})
		if err != nil {
			return 0, fmt.Errorf("correct via table of %s: %w", top, err)
		}
		if err := r.opt.Failpoints.Inject(failpoint.AfterCorrection); err != nil {
			return 0, err
		}
	}
	var end cdc.LSN
	if err := r.opt.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
		return 0, fmt.Errorf("read the position of the corrections: %w", err)
	}
	return end, nil
}
