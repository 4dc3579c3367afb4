package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
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
	// DefaultBatchSize is how many target keys one measurement reads.
	DefaultBatchSize = 1000
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
	// StepTimeout: default DefaultStepTimeout.
	StepTimeout time.Duration
	Metrics     *metrics.Metrics
	Logger      *zap.Logger
}

// Request is an on-demand run.
type Request struct {
	// Counter limits the run to one counter; empty means all.
	Counter   string `json:"counter"`
	DryRun    bool   `json:"dry_run"`
	BatchSize int    `json:"batch_size"`
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
		opt:  opt,
		log:  opt.Logger,
		rec:  NewRecorder(opt.Slot, opt.Logger),
		runs: state.NewRuns(opt.Pool, opt.Slot),
		kick: make(chan struct{}, 1),
	}
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
	batch := req.BatchSize
	if batch <= 0 {
		batch = r.opt.BatchSize
	}
	run, err := r.runs.Create(ctx, state.KindManual, names, req.DryRun, batch)
	if err != nil {
		return RunInfo{}, fmt.Errorf("create reconcile run: %w", err)
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
	if r.opt.Backfill {
		if err := r.backfill(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("backfill failed", zap.Error(err))
		}
	}
	poll := time.NewTicker(r.opt.Poll)
	defer poll.Stop()
	defer func() {
		// A clean stop hands the runs it held to the next walcount at
		// once; a crash leaves them to the lease's expiry.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := r.runs.Release(rctx, r.opt.Owner); err != nil {
			r.log.Debug("cannot release reconcile runs", zap.Error(err))
		}
	}()
	for {
		if r.streaming() {
			if err := r.queueDirty(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("cannot queue the repair of dirty counters", zap.Error(err))
			}
			if err := r.runPending(ctx); err != nil && ctx.Err() == nil {
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

// backfill reconciles the counters that are new or changed, so adding
// walcount to a table that already has rows makes the counts exact.
func (r *Reconciler) backfill(ctx context.Context) error {
	names, err := r.runs.NeedBackfill(ctx, r.opt.Counters)
	if err != nil || len(names) == 0 {
		return err
	}
	if _, ok, err := r.runs.Unfinished(ctx); err != nil || ok {
		return err // an unfinished run resumes first; backfill next start
	}
	r.log.Info("backfilling new counters", zap.Strings("counters", names))
	if _, err := r.runs.Create(ctx, state.KindBackfill, names, false, r.opt.BatchSize); err != nil {
		return err
	}
	return nil
}

// runPending claims and executes every pending or interrupted run, oldest
// first, while this daemon streams.
func (r *Reconciler) runPending(ctx context.Context) error {
	for ctx.Err() == nil && r.streaming() {
		run, ok, err := r.runs.Claim(ctx, r.opt.Owner, r.opt.Lease)
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
	r.log.Info("reconciliation done", zap.Int64("run", run.ID), zap.Int64("keys_checked", run.KeysChecked),
		zap.Int64("drifted", run.Drifted), zap.Int64("corrected", run.Corrected), zap.Duration("took", time.Since(start)))
	return nil
}

func (r *Reconciler) fail(ctx context.Context, run RunInfo, err error) error {
	run.Status = state.StatusFailed
	run.Error = err.Error()
	now := time.Now()
	run.FinishedAt = &now
	if perr := r.runs.Progress(context.WithoutCancel(ctx), run, r.opt.Lease); perr != nil {
		r.log.Error("save failed run", zap.Error(perr))
	}
	r.finish(run)
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

func (r *Reconciler) finish(run RunInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != nil {
		run.Drift = r.current.Drift
	}
	r.current = nil
	r.last = &run
}

// reconcileCounter walks c's target table in key order.
func (r *Reconciler) reconcileCounter(ctx context.Context, run *RunInfo, c counter.Counter) error {
	sql, err := counter.Resolve(ctx, r.opt.Pool, c)
	if err != nil {
		return err
	}
	var after any
	if run.LastKey != "" {
		after = run.LastKey
	}
	for {
		var keys []string
		if run.Keys != nil {
			keys = nextKeys(run.Keys, run.LastKey, run.BatchSize)
		} else if keys, err = r.scan(ctx, sql, after, run.BatchSize); err != nil {
			return err
		}
		if len(keys) == 0 {
			return nil
		}
		drift, applied, err := r.checkBatch(ctx, sql, keys, run.DryRun)
		if err != nil {
			return err
		}
		run.KeysChecked += int64(len(keys))
		run.Drifted += int64(len(drift))
		run.Corrected += int64(len(applied))
		run.LastKey = keys[len(keys)-1]
		after = run.LastKey
		r.opt.Metrics.ReconcileKeysChecked.WithLabelValues(c.Name).Add(float64(len(keys)))
		r.opt.Metrics.ReconcileCorrections.WithLabelValues(c.Name).Add(float64(len(applied)))
		r.update(run, drift)
		if err := r.runs.Progress(ctx, *run, r.opt.Lease); err != nil {
			return err
		}
		r.pace(ctx)
	}
}

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

func (r *Reconciler) scan(ctx context.Context, sql *counter.Resolved, after any, n int) ([]string, error) {
	rows, err := r.opt.Pool.Query(ctx, sql.Scan, after, n)
	if err != nil {
		return nil, fmt.Errorf("scan target keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("scan target keys: %w", err)
	}
	return keys, nil
}

// checkBatch measures keys; where it finds drift it measures the drifted
// keys again and corrects those whose two measurements agree. It returns
// the drifted keys (both measurements agree) and those corrected.
func (r *Reconciler) checkBatch(ctx context.Context, sql *counter.Resolved, keys []string, dry bool) (drift, applied []KeyDrift, err error) {
	first, err := r.measureRetrying(ctx, sql, keys, nil, false)
	if err != nil || len(first.drift) == 0 {
		return nil, nil, err
	}
	prev := make(map[string]int64, len(first.drift))
	again := make([]string, 0, len(first.drift))
	for _, k := range keys {
		if d, ok := first.drift[k]; ok {
			prev[k] = d.Correction
			again = append(again, k)
		}
	}
	second, err := r.measureRetrying(ctx, sql, again, prev, !dry)
	if err != nil {
		return nil, nil, err
	}
	for _, k := range again {
		if d, ok := second.drift[k]; ok && d.Correction == prev[k] {
			drift = append(drift, d)
			if dry {
				r.log.Info("drift found (dry run, not corrected)", zap.String("counter", d.Counter), zap.String("key", d.Key),
					zap.Int64("cached", d.Cached), zap.Int64("true", d.True), zap.Int64("correction", d.Correction))
			}
		}
	}
	if len(second.applied) == 0 {
		return drift, nil, nil
	}
	if err := r.correct(ctx, second.applied); err != nil {
		return nil, nil, err
	}
	for _, d := range second.applied {
		r.log.Warn("corrected drift", zap.String("counter", d.Counter), zap.String("key", d.Key),
			zap.Int64("cached", d.Cached), zap.Int64("true", d.True), zap.Int64("correction", d.Correction))
	}
	return drift, second.applied, nil
}

// correct carries corrections through the WAL: one transactional message
// holds them, the stream turns it into deltas of its transaction, and they
// are flushed exactly once with everything else, even when walcount
// crashes before that flush and the stream is replayed. They count as
// applied only once W has passed the message, so a run's figures never
// claim a correction that is not in the counter columns.
func (r *Reconciler) correct(ctx context.Context, drift []KeyDrift) error {
	c := correction{Correct: make(map[string]int64, len(drift)), Slot: r.opt.Slot}
	for _, d := range drift {
		c.Correct[counter.Field(d.Counter, d.Key)] = d.Correction
	}
	content, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := cdc.EmitMessage(ctx, r.opt.Pool, string(content)); err != nil {
		return fmt.Errorf("emit corrections: %w", err)
	}
	if err := r.opt.Failpoints.Inject(failpoint.AfterCorrection); err != nil {
		return err
	}
	// The message's transaction ends before the server's insert position
	// read after it committed.
	var end cdc.LSN
	if err := r.opt.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
		return fmt.Errorf("read the position of the corrections: %w", err)
	}
	return r.waitCheckpoint(ctx, end, nil)
}

// measureRetrying repeats a measurement that a session restart or a
// timeout interrupted.
func (r *Reconciler) measureRetrying(ctx context.Context, sql *counter.Resolved, keys []string, prev map[string]int64, apply bool) (outcome, error) {
	var err error
	for attempt := 1; attempt <= DefaultMaxAttempts; attempt++ {
		var out outcome
		out, err = r.measure(ctx, sql, keys, prev, apply)
		if err == nil || ctx.Err() != nil {
			return out, err
		}
		r.log.Debug("measurement interrupted; measuring again", zap.Error(err), zap.Int("attempt", attempt))
		select {
		case <-ctx.Done():
			return outcome{}, ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	return outcome{}, fmt.Errorf("measure %d keys of %s: gave up after %d attempts: %w", len(keys), sql.Counter.Name, DefaultMaxAttempts, err)
}

// measure runs one bracketed measurement (see the package documentation).
func (r *Reconciler) measure(ctx context.Context, sql *counter.Resolved, keys []string, prev map[string]int64, apply bool) (outcome, error) {
	r.seq++
	m := &measurement{
		id:      strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(r.seq, 10),
		counter: sql.Counter.Name,
		keys:    keys,
		prev:    prev,
		apply:   apply,
	}
	if err := r.rec.register(m); err != nil {
		return outcome{}, err
	}
	defer r.rec.unregister(m)

	// 1. M0, and wait until its transaction committed in the stream.
	if _, err := cdc.EmitMessage(ctx, r.opt.Pool, r.markerJSON(m.id, 0)); err != nil {
		return outcome{}, err
	}
	if err := r.wait(ctx, m.committed, m.done, "marker M0 in the stream"); err != nil {
		return outcome{}, err
	}
	// 2. W past M0.
	if err := r.waitCheckpoint(ctx, m.m0End, m.done); err != nil {
		return outcome{}, err
	}
	// 3. Truth, column, W and the snapshot, all in one snapshot.
	snap, ws, truth, column, err := r.read(ctx, sql, keys)
	if err != nil {
		return outcome{}, err
	}
	r.rec.setSnapshot(m, snap, ws, truth, column)
	// 4. M1; the recorder evaluates when it arrives.
	if _, err := cdc.EmitMessage(ctx, r.opt.Pool, r.markerJSON(m.id, 1)); err != nil {
		return outcome{}, err
	}
	if err := r.wait(ctx, m.done, nil, "marker M1 in the stream"); err != nil {
		return outcome{}, err
	}
	if m.err != nil {
		return outcome{}, m.err
	}
	return m.out, nil
}

func (r *Reconciler) markerJSON(id string, phase int) string {
	return fmt.Sprintf(`{"reconcile":%q,"phase":%d,"slot":%q}`, id, phase, r.opt.Slot)
}

// wait waits for ch, failing early when failed closes (the measurement
// ended with an error).
func (r *Reconciler) wait(ctx context.Context, ch, failed <-chan struct{}, what string) error {
	t := time.NewTimer(r.opt.StepTimeout)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-failed:
		return errSessionRestarted
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("timed out after %s waiting for %s", r.opt.StepTimeout, what)
	}
}

// waitCheckpoint flushes until W reaches lsn.
func (r *Reconciler) waitCheckpoint(ctx context.Context, lsn cdc.LSN, failed <-chan struct{}) error {
	deadline := time.Now().Add(r.opt.StepTimeout)
	for {
		w, err := state.ReadCheckpoint(ctx, r.opt.Pool, r.opt.Slot)
		if err != nil {
			return err
		}
		if w >= lsn {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for the checkpoint to pass %s (at %s)", r.opt.StepTimeout, lsn, w)
		}
		if r.opt.Flush != nil {
			if err := r.opt.Flush(ctx); err != nil && !errors.Is(err, ErrNotStreaming) {
				return err
			}
		}
		select {
		case <-failed:
			return errSessionRestarted
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// read takes the snapshot S and reads W_S, the truth and the column in
// it.
func (r *Reconciler) read(ctx context.Context, sql *counter.Resolved, keys []string) (Snapshot, cdc.LSN, map[string]int64, map[string]int64, error) {
	var snap Snapshot
	var ws cdc.LSN
	truth := make(map[string]int64, len(keys))
	column := make(map[string]int64, len(keys))
	err := pgx.BeginTxFunc(ctx, r.opt.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		s, w, err := state.SnapshotCheckpoint(ctx, tx, r.opt.Slot)
		if err != nil {
			return err
		}
		ws = w
		if snap, err = ParseSnapshot(s); err != nil {
			return err
		}
		if err := collect(ctx, tx, sql.Truth, append([]any{keys}, sql.FilterArgs...), truth); err != nil {
			return fmt.Errorf("read true values: %w", err)
		}
		if err := collect(ctx, tx, sql.Column, []any{keys}, column); err != nil {
			return fmt.Errorf("read counter column: %w", err)
		}
		return nil
	})
	return snap, ws, truth, column, err
}

func collect(ctx context.Context, tx pgx.Tx, query string, args []any, into map[string]int64) error {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	var k string
	var v int64
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error {
		into[k] = v
		return nil
	})
	return err
}
