package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/events"
	"github.com/walcount/walcount/fresh"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/operator"
	"github.com/walcount/walcount/internal/redact"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/sink"
	"github.com/walcount/walcount/slot"
)

// Defaults of Options.
const (
	// DefaultShutdownTimeout bounds the final flush on SIGINT/SIGTERM.
	DefaultShutdownTimeout = 30 * time.Second
	DefaultRetryMin        = 500 * time.Millisecond
	DefaultRetryMax        = 30 * time.Second
	// DefaultTakeoverPoll is how often a standby instance retries a slot
	// that another walcount holds.
	DefaultTakeoverPoll = time.Second
)

// The Redis buffer serves every stage that needs one, through the narrow
// interface each declares.
var (
	_ aggregator.Buffer = (*buffer.Redis)(nil)
	_ sink.Buffer       = (*buffer.Redis)(nil)
)

// Options configure a Daemon.
type Options struct {
	Config config.Config
	// ShutdownTimeout bounds the final flush; default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// StatusInterval and ReceiveTimeout tune cdc; zero uses cdc's
	// defaults.
	StatusInterval time.Duration
	ReceiveTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between sessions.
	RetryMin, RetryMax time.Duration
	Metrics            *metrics.Metrics
	Logger             *zap.Logger
	// Failpoints are armed by crash tests; nil in production.
	Failpoints *failpoint.Set
	// ParkRetry is how long a parked key waits before a flush tries it
	// again; zero uses sink.DefaultParkRetry.
	ParkRetry time.Duration
	// ViaCollectInterval is how often the via rows of deleted parents
	// are deleted (CollectVia); zero uses DefaultViaCollectInterval.
	ViaCollectInterval time.Duration
	// FlushChunk, FlushTransactionKeys and FlushTransactionTime bound
	// the flush's statements and transactions (sink.Options ChunkSize,
	// TransactionKeys and TransactionTime); zero uses the config's
	// setting, else sink's defaults.
	FlushChunk, FlushTransactionKeys int
	FlushTransactionTime             time.Duration

	// replayFromSlot starts streaming at the slot's confirmed position
	// instead of W, so that tests see the server resend what is applied.
	replayFromSlot bool
}

// Daemon is walcount run. Create it with New, start it with Run.
type Daemon struct {
	opt Options
	cfg config.Config
	log *zap.Logger
	m   *metrics.Metrics
	// tally holds what the stages count for /status, across sessions.
	tally *counter.Tally
	pool  *pgxpool.Pool
	// slotDB reaches the server that holds the slot: replication_url's
	// when it names another server than database_url (a hot standby that
	// decodes, or a pooler's direct connection), else pool. Every read
	// and write of the slot goes there; everything else goes to pool.
	slotDB *pgxpool.Pool
	rdb    redis.UniversalClient
	buf    *buffer.Redis
	// readPool is the fresh reads' own small pool, and fresh their reader
	// (docs/design.md §7): a read never takes a connection the stream or
	// the flush needs.
	readPool *pgxpool.Pool
	fresh    *fresh.Reader
	// events publishes the change events of the flushes (nil: off).
	events *events.Publisher
	lag    *sink.LagTracker
	// flushes outlives sessions: a restarted session meets the markers
	// of flushes an earlier one made.
	flushes *sink.FlushLog
	// refusals are the source transactions the aggregator must hold
	// whole, across sessions (aggregator.ErrRespill).
	refusals aggregator.Refusals
	mon      *slot.Monitor
	rec      *reconcile.Reconciler

	// standbyMisses is owned by the observe goroutine (checkStandbyWait).
	standbyMisses int

	mu    sync.Mutex
	state daemonState
}

// daemonState is what /status shows; guarded by Daemon.mu.
type daemonState struct {
	streaming    bool
	stream       *cdc.Stream
	gate         *sink.StandbyGate
	flusher      *sink.Flusher
	lastErr      error
	lastErrAt    time.Time
	failures     int
	sessionStart time.Time
	waiting      bool
	// failureLoggedAt is when a failed session was last logged at error
	// level (see logFailure).
	failureLoggedAt time.Time
	// failedStage is where the last failed session was when it failed,
	// a metrics.Stage value (see setErr).
	failedStage string
	// progress is what the daemon last saw of W and the stream (see
	// status.go), kept across sessions.
	progress progress
	// redisEviction says why Redis may evict walcount's keys; empty when
	// it may not, or when its settings cannot be read.
	redisEviction string
	// degraded holds the counters that cannot be kept from the stream
	// right now (see aggregator.Options.Degraded).
	degraded map[string]bool
	// bound is the OID each configured table name was bound to by the
	// last session; unbound holds the counters whose tables are not what
	// the publication holds, with why (see relations.go).
	bound   map[string]uint32
	unbound map[string]string
	// unlogged holds, by counter, the UNLOGGED leaves of its source the
	// partition watch last saw: such a counter is degraded too.
	unlogged map[string][]string
	// standbyWait is the walsender's wait for the standbys named in
	// synchronized_standby_slots, nil when it does not wait (see
	// checkStandbyWait).
	standbyWait *StandbyWait
	// slotWait is what the creation of the slot waits for, nil when no
	// creation waits (see watchSlotCreation).
	slotWait *SlotCreationWait
	// silentPID is the walsender of the last stream declared silent
	// (cdc.ErrStreamSilent): while it still holds the slot, the slot is
	// not another walcount's (see takeBackSlot).
	silentPID uint32
}

// New connects nothing yet; it validates the URLs and builds the clients.
func New(opt Options) (*Daemon, error) {
	if opt.ViaCollectInterval <= 0 {
		opt.ViaCollectInterval = DefaultViaCollectInterval
	}
	if opt.ShutdownTimeout <= 0 {
		opt.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opt.RetryMin <= 0 {
		opt.RetryMin = DefaultRetryMin
	}
	if opt.RetryMax <= 0 {
		opt.RetryMax = DefaultRetryMax
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	cfg := opt.Config
	if len(cfg.Counters) == 0 {
		cfg.Counters = []counter.Counter{counter.Default()}
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, &config.Error{Problems: []config.Problem{{Field: "database_url", Msg: fmt.Sprintf("cannot parse %s: %v", redact.URL(cfg.DatabaseURL), redactErr(err))}}}
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = "walcount"
	// walcount's own bounds for its sessions: settings sent at connection
	// start win over those of the database and the role (ALTER ROLE ...
	// SET lock_timeout = '1ms' must not wedge it). The flush sets tighter
	// ones in its transaction (sink.Options).
	for k, v := range cfg.SessionSettings() {
		pcfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.ApplyQueryExecMode(pcfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, fmt.Errorf("create postgres pool: %w", err)
	}
	slotDB := pool
	if cfg.SeparateSlotServer() {
		if slotDB, err = newSlotPool(cfg); err != nil {
			pool.Close()
			return nil, err
		}
	}
	ropt, err := cfg.RedisOptions()
	if err != nil {
		pool.Close()
		closeSlotPool(pool, slotDB)
		return nil, &config.Error{Problems: []config.Problem{{Field: "redis_url", Msg: fmt.Sprintf("cannot parse %s: %v", redact.URL(cfg.RedisURL), redactErr(err))}}}
	}
	rdb := redisconn.New(ropt, opt.Logger)
	for _, c := range cfg.Counters {
		opt.Metrics.InitCounter(c.Name)
		if v, _ := c.Extremum(); v != "" {
			opt.Metrics.InitExtremum(c.Name)
		}
	}
	d := &Daemon{
		opt:     opt,
		cfg:     cfg,
		log:     opt.Logger.With(zap.String(logSlot, cfg.Slot)),
		m:       opt.Metrics,
		tally:   counter.NewTally(),
		pool:    pool,
		slotDB:  slotDB,
		rdb:     rdb,
		buf:     buffer.New(rdb, cfg.Slot),
		lag:     sink.NewLagTracker(0),
		flushes: sink.NewFlushLog(),
		mon: slot.New(slot.Options{Querier: slotDB, Slot: cfg.Slot, Interval: cfg.SlotSettings.PollInterval,
			MaxLagBytes: cfg.SlotSettings.MaxLagBytes, Metrics: opt.Metrics, Logger: opt.Logger,
			KeepWatchingLostSlot: cfg.OnSlotLoss == config.SlotLossRecreate}),
	}
	d.rec = d.newReconciler()
	d.events = events.New(events.Options{Redis: rdb, Slot: cfg.Slot, Counters: cfg.Counters, MaxLen: cfg.EventsMaxLen,
		Metrics: opt.Metrics, Logger: d.log})
	if err := d.newFreshReader(pcfg); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Log field keys. Every line of the daemon carries logSlot; a position
// is logged under logLSN.
const (
	logSlot     = "slot"
	logLSN      = "lsn"
	logFailures = "failures"
	logRetryIn  = "retry_in_seconds"
)

// redactErr drops connection strings that parse errors may echo.
func redactErr(err error) string { return redact.URL(err.Error()) }

// Close releases the connections. Call it after Run returned.
func (d *Daemon) Close() {
	if d.readPool != nil {
		d.readPool.Close()
	}
	d.pool.Close()
	closeSlotPool(d.pool, d.slotDB)
	_ = d.rdb.Close()
}

// Pool returns the daemon's PostgreSQL pool (for the HTTP API and
// reconciliation).
func (d *Daemon) Pool() *pgxpool.Pool { return d.pool }

// Redis returns the daemon's Redis client.
func (d *Daemon) Redis() redis.UniversalClient { return d.rdb }

// fatal reports whether err needs an operator rather than a retry. The
// errors say it themselves (operator.Needed): the sentinels of counter,
// state, buffer, aggregator, cdc, slot and failpoint that stop the daemon
// are operator errors, and so is a *slot.SlotLostError.
func fatal(err error) bool { return operator.Needed(err) }

// Run runs sessions until ctx is done (returns nil after a clean
// shutdown) or a fatal error occurs.
func (d *Daemon) Run(ctx context.Context) error {
	d.log.Info("walcount starting",
		zap.String("database", redact.URL(d.cfg.DatabaseURL)),
		zap.String("redis", redact.URL(d.cfg.RedisURL)),
		zap.String("publication", d.cfg.Publication),
		zap.Duration("flush_interval_seconds", d.cfg.FlushInterval),
		zap.Int("counters", len(d.cfg.Counters)))
	// The slot monitor runs for the daemon's lifetime; a lost slot ends
	// everything (design rule 12).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The goroutines that live as long as Run run under one group;
	// the first of them to fail for good (a lost slot, a crash test)
	// cancels ctx with its error as the cause, which the loop below
	// reports. Run returns only after all of them returned.
	var bg errgroup.Group
	defer func() { cancel(nil); _ = bg.Wait() }()
	// Reconciliation runs for the daemon's lifetime too; its measurements
	// need a streaming session and are repeated when one ends.
	bg.Go(func() error {
		err := d.rec.Run(ctx)
		switch {
		case errors.Is(err, failpoint.ErrCrash):
			cancel(err) // a crash test: stop as a killed process would
			return err
		case err != nil:
			d.log.Error("reconciler stopped", zap.Error(err))
		}
		return nil
	})
	bg.Go(func() error {
		// Run's loop logs the stop, once, whichever of the monitor and
		// the session saw the lost slot first.
		err := d.mon.Run(ctx)
		if err != nil {
			cancel(err)
		}
		return err
	})
	// The observer refreshes the metrics no event updates, and warns once
	// about an unlimited max_slot_wal_keep_size.
	bg.Go(func() error { d.observe(ctx); return nil })
	bg.Go(func() error { d.watchPartitions(ctx); return nil })
	bg.Go(func() error { d.collectVia(ctx); return nil })
	bg.Go(func() error { d.watchTargetViews(ctx, cancel); return nil })
	backoff := d.opt.RetryMin
	for {
		start := time.Now()
		err := classifyPooling(d.session(ctx))
		if cause := context.Cause(ctx); isSlotLost(cause) || errors.Is(cause, failpoint.ErrCrash) || errors.Is(cause, counter.ErrPartialView) {
			d.setErr(cause)
			d.logStop(cause)
			return cause
		}
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				d.log.Warn("stopped with an error during shutdown", zap.Error(redactedError{err}))
			}
			return nil
		}
		if err == nil {
			return nil
		}
		d.setErr(err)
		if d.cfg.OnSlotLoss == config.SlotLossRecreate && (isSlotLost(err) || errors.Is(err, cdc.ErrSlotMissing)) {
			// on_slot_loss: recreate. The history in between is gone:
			// every counter is marked dirty and reconciled.
			if rerr := d.recreateSlot(ctx, err); rerr != nil {
				d.logFailure(fmt.Errorf("recreate the lost slot: %w", rerr), backoff)
			} else {
				continue
			}
		} else if fatal(err) {
			d.logStop(err)
			return err
		}
		wait := backoff
		if errors.Is(err, cdc.ErrSlotInUse) {
			wait = DefaultTakeoverPoll
			d.mu.Lock()
			first := !d.state.waiting
			d.state.waiting = true
			d.mu.Unlock()
			if first {
				d.log.Info("the slot is held by another walcount; waiting to take over", zap.Error(err))
			}
		} else {
			if time.Since(start) > time.Minute {
				backoff = d.opt.RetryMin
				wait = backoff
			}
			d.logFailure(err, wait)
			backoff = min(backoff*2, d.opt.RetryMax)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(jitter(wait)):
		}
	}
}

// WatchSlot polls the replication slot and exports its readings until
// stop is called, for the time before Run: walcount run's preflight checks
// may wait long for a server (Redis down) while the slot retains WAL, and
// that is when the slot's metrics must not vanish. Call stop before Run,
// which watches the slot itself for its whole lifetime. A lost slot seen
// here stays in the metrics; the preflight checks refuse it.
//
// It is a monitor of its own that logs nothing: the preflight checks report
// what is wrong with the slot, once, with the fix, and Run's monitor then
// logs its changes from its first reading.
func (d *Daemon) WatchSlot(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	mon := slot.New(slot.Options{Querier: d.slotDB, Slot: d.cfg.Slot, Interval: d.cfg.SlotSettings.PollInterval,
		MaxLagBytes: d.cfg.SlotSettings.MaxLagBytes, Metrics: d.opt.Metrics, KeepWatchingLostSlot: true})
	go func() {
		defer close(done)
		_ = mon.Run(ctx)
	}()
	return func() { cancel(); <-done }
}

// jitter spreads a wait over ±20%, so that a fleet of walcount instances
// (standbys waiting for a slot, daemons that lost the same server) does not
// retry in lockstep.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + rand.N(2*d/5+1)
}

// logStop logs the error that stops the daemon for good.
func (d *Daemon) logStop(err error) {
	msg := "stopping: this error needs an operator"
	if isSlotLost(err) {
		msg = "stopping: the replication slot is lost"
	}
	d.log.Error(msg, zap.Error(redactedError{err}))
}

// FailureLogInterval is how often a streak of failed sessions is logged
// at error level after its first failure; the failures in between are
// logged at debug. The streak ends with one "recovered" line.
const FailureLogInterval = 30 * time.Second

// logFailure logs the first failure of a streak as an error and later
// ones at most every FailureLogInterval, so a long outage does not flood
// the log.
func (d *Daemon) logFailure(err error, wait time.Duration) {
	now := time.Now()
	d.mu.Lock()
	d.state.failures++
	n := d.state.failures
	stage := d.state.failedStage
	loud := n == 1 || now.Sub(d.state.failureLoggedAt) >= FailureLogInterval
	if loud {
		d.state.failureLoggedAt = now
	}
	d.mu.Unlock()
	// Every failure counts, whatever failed: the log is rate-limited,
	// the counter is what alerts read.
	d.m.SessionFailures.WithLabelValues(stage).Inc()
	if loud {
		d.log.Error("session failed; retrying", zap.Error(redactedError{err}), zap.Duration(logRetryIn, wait), zap.Int(logFailures, n))
	} else {
		d.log.Debug("session failed again", zap.Error(redactedError{err}), zap.Duration(logRetryIn, wait), zap.Int(logFailures, n))
	}
}

// StartFailed records a start of walcount run that could not go on yet
// because a server did not answer (before Run, in the preflight checks) as
// a failed session at start: it is logged like one, with the retry,
// counted in walcount_session_failures_total{stage="start"} and shown by
// /readyz and /status, and the first session that streams logs the
// recovery.
func (d *Daemon) StartFailed(err error, retryIn time.Duration) {
	d.setErr(err)
	d.logFailure(err, retryIn)
}

func (d *Daemon) setErr(err error) {
	d.mu.Lock()
	// The failed session streamed if it started streaming after the
	// previous failure (sessionStart is set only once a session streams).
	d.state.failedStage = metrics.StageStart
	if d.state.sessionStart.After(d.state.lastErrAt) {
		d.state.failedStage = metrics.StageStreaming
	}
	d.state.lastErr = redactedError{err}
	d.state.lastErrAt = time.Now()
	d.state.streaming = false
	d.mu.Unlock()
	d.m.Streaming.Set(0)
	// A standby waits for the slot on purpose; alerts on a walcount that
	// does not stream leave it out.
	if errors.Is(err, cdc.ErrSlotInUse) {
		d.m.WaitingForSlot.Set(1)
	} else {
		d.m.WaitingForSlot.Set(0)
	}
}

// redactedError masks credentials in an error's text.
type redactedError struct{ err error }

func (e redactedError) Error() string { return redact.URL(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

// newSlotPool opens the small pool of SQL connections to replication_url's
// server (see Daemon.slotDB).
func newSlotPool(cfg config.Config) (*pgxpool.Pool, error) {
	scfg, err := pgxpool.ParseConfig(cfg.ReplicationURL)
	if err != nil {
		return nil, &config.Error{Problems: []config.Problem{{Field: "replication_url", Msg: fmt.Sprintf("cannot parse %s: %v", redact.URL(cfg.ReplicationURL), redactErr(err))}}}
	}
	delete(scfg.ConnConfig.RuntimeParams, "replication")
	scfg.ConnConfig.RuntimeParams["application_name"] = "walcount"
	for k, v := range config.PostgresSessionSettings {
		scfg.ConnConfig.RuntimeParams[k] = v
	}
	scfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(context.Background(), scfg)
	if err != nil {
		return nil, fmt.Errorf("create the replication server's pool: %w", err)
	}
	return pool, nil
}

// closeSlotPool closes slotDB when it is a pool of its own.
func closeSlotPool(pool, slotDB *pgxpool.Pool) {
	if slotDB != pool {
		slotDB.Close()
	}
}
