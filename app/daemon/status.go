package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/sink"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

const (
	// MetricsInterval is how often the daemon refreshes the metrics that no
	// event updates: walcount_checkpoint_age_seconds, walcount_buffer_keys
	// and walcount_queue_depth. /status refreshes them too.
	MetricsInterval = time.Second
	// EvictionCheckInterval is how often the daemon reads Redis's
	// maxmemory settings.
	EvictionCheckInterval = 30 * time.Second
	// sampleTimeout bounds each read of Redis or PostgreSQL made to refresh
	// those metrics, so that a hung server delays neither the ticker nor
	// /status by more than that.
	sampleTimeout = 2 * time.Second
)

// Status is the daemon's view, served as JSON at /status. It never holds
// a password: errors are redacted before they are stored.
type Status struct {
	Slot           string `json:"slot"`
	Publication    string `json:"publication"`
	Streaming      bool   `json:"streaming"`
	WaitingForSlot bool   `json:"waiting_for_slot"`
	// Checkpoint is W, the LSN in walcount.checkpoint; CheckpointAge is
	// the time since it last moved, in seconds. Both are the last known
	// values while PostgreSQL is unreachable.
	Checkpoint    string   `json:"checkpoint_lsn,omitempty"`
	CheckpointAge *float64 `json:"checkpoint_age_seconds,omitempty"`
	// Received is the end LSN of the last transaction received from the
	// stream, kept after the session ends.
	Received string `json:"received_lsn,omitempty"`
	// LastFlush is when W last moved: the commit of the last flush.
	LastFlush *time.Time `json:"last_flush,omitempty"`
	// BufferKeys is the number of keys in the Redis buffer (buffer and
	// flushing) and carried by the flushes; absent when Redis does not
	// answer.
	BufferKeys *int64 `json:"buffer_keys,omitempty"`
	// Carried is what the flushes carried to the next one: keys whose
	// target row another transaction holds locked (the oldest named),
	// and parked keys whose update failed on the row's data (design
	// rule 2); absent when PostgreSQL does not answer.
	Carried *state.CarriedSummary `json:"carried,omitempty"`
	// QueueDepth is the number of transactions waiting between the stream
	// and the aggregator.
	QueueDepth   int        `json:"queue_depth"`
	SessionStart *time.Time `json:"session_start,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	LastErrorAt  *time.Time `json:"last_error_at,omitempty"`
	Failures     int        `json:"consecutive_failures"`
	// Counters lists the configured counters with what this process has
	// done for each since it started.
	Counters []CounterStatus `json:"counters"`
	// StandbySlots are the physical slots (synchronized_standby_slots)
	// that must have a flush before its W is confirmed to the slot;
	// AckHeldBytes is how far the confirmed W trails for them.
	StandbySlots []string `json:"standby_slots,omitempty"`
	AckHeldBytes int64    `json:"ack_held_bytes"`
	// Dirty lists what walcount cannot vouch for until reconciliation
	// repaired it, with the cause; Degraded the counters it cannot keep
	// from the stream right now (their repair waits until it can).
	Dirty    []state.Dirty `json:"dirty,omitempty"`
	Degraded []string      `json:"degraded,omitempty"`
	// ApplyLag is how far the counter columns trail the source's
	// commits: the wait of the oldest transaction received and not yet
	// applied, and the largest lag of the last flush's transactions.
	ApplyLag sink.ApplyLag `json:"apply_lag"`
	// RedisEviction says why Redis may evict walcount's keys, with the
	// fix; absent when it may not.
	RedisEviction string `json:"redis_eviction,omitempty"`
	// StandbyWait is the walsender's wait for the standbys named in
	// synchronized_standby_slots, while it lasts.
	StandbyWait *StandbyWait `json:"standby_wait,omitempty"`
	// SlotCreationWait is what the creation of the replication slot
	// (on_slot_loss: recreate) waits for, while it does.
	SlotCreationWait *SlotCreationWait `json:"slot_creation_wait,omitempty"`
	SlotStatus       *slot.SlotStatus  `json:"slot_status,omitempty"`
	Reconcile        any               `json:"reconcile,omitempty"`
	// FreshReads is what the fresh reads did since this process started;
	// absent in a process that serves none.
	FreshReads *FreshReadStatus `json:"fresh_reads,omitempty"`
	// Events is the change events' streams; absent when they are off.
	Events *EventsStatus `json:"events,omitempty"`
}

// CounterStatus is one counter in /status. The numbers count from the start
// of this process, like the metrics they are read from.
type CounterStatus struct {
	Name string `json:"name"`
	// Source is the counted table; Target is table.column of the cache.
	Source string `json:"source"`
	Target string `json:"target"`
	// Changes counts matching row changes received, by operation
	// (walcount_changes_total).
	Changes map[string]int64 `json:"changes"`
	// DeltasFlushed and DeltasDropped count deltas applied and dropped for
	// want of a target row (walcount_deltas_flushed_total,
	// walcount_deltas_dropped_total).
	DeltasFlushed int64 `json:"deltas_flushed"`
	DeltasDropped int64 `json:"deltas_dropped"`
	// Corrections counts reconciliation corrections
	// (walcount_reconcile_corrections_total).
	Corrections int64 `json:"reconcile_corrections"`
}

// progress is what the daemon last saw of W and of the stream. It outlives
// sessions, so that /status and the metrics keep the last known values while
// PostgreSQL is down or no session runs. Only the observe goroutine stores it
// (in state.progress, under Daemon.mu); Status computes a fresh copy without
// storing it, so a slow /status can never move it backwards.
type progress struct {
	w        cdc.LSN   // W
	movedAt  time.Time // when W last moved; zero until known
	received cdc.LSN   // end LSN of the last transaction received
}

// snapshot is one refreshed reading of the figures no event updates.
type snapshot struct {
	st         daemonState
	p          progress
	bufferKeys *int64
	carried    *state.CarriedSummary
	queueDepth int
	queueBytes int64
	dirty      []state.Dirty
	// ackHeld and standbySlots are the standby gate's (see
	// sink.StandbyGate).
	ackHeld      int64
	standbySlots []string
}

// observe refreshes the sampled metrics every MetricsInterval until ctx is
// done. It also reads max_slot_wal_keep_size once PostgreSQL answers and warns
// when it is unlimited.
func (d *Daemon) observe(ctx context.Context) {
	t := time.NewTicker(MetricsInterval)
	defer t.Stop()
	keepChecked := false
	var evictionAt time.Time
	for {
		if !keepChecked {
			keepChecked = d.checkWALKeepSize(ctx)
		}
		if time.Since(evictionAt) >= EvictionCheckInterval {
			evictionAt = time.Now()
			d.checkEviction(ctx)
		}
		s := d.sample(ctx)
		d.mu.Lock()
		d.state.progress = s.p
		d.mu.Unlock()
		d.checkStandbyWait(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkWALKeepSize logs what max_slot_wal_keep_size means for the slot: a
// warning with the advice when it is -1, an info line with the limit
// otherwise. It reports false when the setting could not be read, so that
// the caller tries again; the session reports an unreachable server itself.
func (d *Daemon) checkWALKeepSize(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	keep, err := slot.ReadMaxSlotWALKeepSize(rctx, d.slotDB)
	if err != nil {
		return false
	}
	if keep < 0 {
		d.log.Warn("max_slot_wal_keep_size is -1 (unlimited): the slot can never be lost, but while walcount is " +
			"stopped or falls behind PostgreSQL keeps every WAL segment since the slot's position and can fill its disk. " +
			"Alert on the WAL the slot retains (walcount_slot_retained_wal_bytes) and on the disk (deploy/prometheus/alerts.yml: WalcountSlotRetainedWALGrowing, " +
			"and the walcount-postgres group for while no walcount runs), and consider a limit sized to the longest outage to survive " +
			"(ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();); a slot past the limit is lost " +
			"and needs walcount setup --recreate-slot (or on_slot_loss: recreate) and a repair of every counter")
		return true
	}
	d.log.Info("max_slot_wal_keep_size limits the WAL the slot may keep; past it the slot is lost",
		zap.Int64("max_slot_wal_keep_size_bytes", keep))
	return true
}

// checkEviction reads Redis's maxmemory settings and warns once each time
// they come to allow evicting walcount's keys (walcount detects a lost key
// and replays, but a Redis that keeps evicting keeps W from moving).
func (d *Daemon) checkEviction(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	ev, err := buffer.ReadEviction(rctx, d.rdb)
	if err != nil {
		return
	}
	msg := ""
	if ev.Risky() {
		msg = ev.String() + "; fix: " + buffer.EvictionFix
	}
	d.mu.Lock()
	changed := msg != d.state.redisEviction
	d.state.redisEviction = msg
	d.mu.Unlock()
	if changed && msg != "" {
		d.log.Warn("redis may evict walcount's keys", zap.String("redis_eviction", msg))
	}
}

// sample brings the daemon's progress up to date and exports
// walcount_checkpoint_age_seconds, walcount_buffer_keys and
// walcount_queue_depth. It does not store the progress; observe does.
//
// It never waits for the flusher: a flush that hangs (a lock wait on a hot
// row, a slow server) holds the flusher's lock, and that is exactly when
// /status and the checkpoint age must keep answering. W and the time it
// moved are read from PostgreSQL instead, which also sees W move when
// another walcount holds the slot.
func (d *Daemon) sample(ctx context.Context) snapshot {
	d.mu.Lock()
	st := d.state
	d.mu.Unlock()
	s := snapshot{st: st, p: d.readCheckpoint(ctx, st.progress)}
	if !s.p.movedAt.IsZero() {
		d.m.CheckpointAgeSeconds.Set(max(time.Since(s.p.movedAt), 0).Seconds())
	}

	if st.stream != nil {
		if r := st.stream.ReceivedLSN(); r != 0 {
			s.p.received = r
		}
		s.queueDepth = st.stream.QueueDepth()
		s.queueBytes = st.stream.QueueBytes()
	}
	d.m.QueueDepth.Set(float64(s.queueDepth))
	if st.gate != nil {
		s.ackHeld, s.standbySlots = st.gate.Held(), st.gate.Slots()
	}
	d.m.AckHeldBytes.Set(float64(s.ackHeld))
	d.m.QueueBytes.Set(float64(s.queueBytes))

	rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	if c, err := state.ReadCarriedSummary(rctx, d.pool, d.cfg.Slot); err == nil {
		s.carried = &c
		d.m.FlushKeysDeferred.Set(float64(c.Deferred))
		d.m.FlushOldestDeferredSeconds.Set(c.OldestAge)
		d.m.KeysParked.Set(float64(c.Parked))
	}
	if dirty, err := state.ListDirty(rctx, d.pool, d.cfg.Slot); err == nil {
		s.dirty = dirty
		marked := map[string]bool{}
		for _, m := range dirty {
			marked[m.Counter] = true
		}
		for _, c := range d.cfg.Counters {
			v := 0.0
			if marked[c.Name] {
				v = 1
			}
			d.m.CounterDirty.WithLabelValues(c.Name).Set(v)
		}
	}
	// Redis gets a budget of its own: a Redis that does not answer must
	// not take the time of the PostgreSQL reads above.
	redisCtx, redisCancel := context.WithTimeout(ctx, sampleTimeout)
	defer redisCancel()
	if n, err := d.buf.Len(redisCtx); err == nil {
		if s.carried != nil {
			n += s.carried.Deferred + s.carried.Parked
		}
		s.bufferKeys = &n
		d.m.BufferKeys.Set(float64(n))
	}
	return s
}

// readCheckpoint returns p with W and the time it last moved as PostgreSQL
// holds them, or p unchanged when PostgreSQL does not answer, so that the
// age keeps growing from the last known move. The age is measured by the
// server's clock and turned into a local time, so that clock skew between
// the hosts does not distort it. A plain read is not blocked by a flush in
// progress, which holds the row's lock: it sees the last committed W.
func (d *Daemon) readCheckpoint(ctx context.Context, p progress) progress {
	rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	w, age, err := state.ReadCheckpointAge(rctx, d.pool, d.cfg.Slot)
	if err != nil {
		return p
	}
	p.w = w
	p.movedAt = time.Now().Add(-age)
	// The flusher sets walcount_checkpoint_lsn when it commits; this read
	// fills it in before the first flush and while another walcount moves
	// W. W never goes backwards, so an older reading must not win.
	if float64(w) > gaugeValue(d.m.CheckpointLSN) {
		d.m.CheckpointLSN.Set(float64(w))
	}
	return p
}

// Status returns the daemon's current view. It also refreshes the sampled
// metrics, so a scrape right after a /status request sees the same figures.
func (d *Daemon) Status(ctx context.Context) Status {
	// The eviction policy is read beside the sample, not before it: with
	// Redis down each Redis read takes its whole timeout, and /status must
	// answer within about one of them (walcount status asks it while Redis
	// is down, to show why the slot is inactive).
	evicted := make(chan struct{})
	go func() { defer close(evicted); d.checkEviction(ctx) }()
	smp := d.sample(ctx)
	<-evicted
	d.mu.Lock()
	smp.st.redisEviction = d.state.redisEviction
	d.mu.Unlock()
	st, p := smp.st, smp.p
	s := Status{
		Slot:           d.cfg.Slot,
		Publication:    d.cfg.Publication,
		Streaming:      st.streaming,
		WaitingForSlot: st.waiting,
		Failures:       st.failures,
		BufferKeys:     smp.bufferKeys,
		Carried:        smp.carried,
		QueueDepth:     smp.queueDepth,
		RedisEviction:  st.redisEviction,
		Dirty:          smp.dirty,
		StandbySlots:   smp.standbySlots,
		AckHeldBytes:   smp.ackHeld,
		ApplyLag:       d.lag.Lag(time.Now()),
	}
	if w := st.standbyWait; w != nil {
		c := *w
		c.Seconds = max(time.Since(c.Since), 0).Seconds()
		s.StandbyWait = &c
	}
	if w := st.slotWait; w != nil {
		c := *w
		c.WaitingSeconds = max(time.Since(c.Since), 0).Seconds()
		s.SlotCreationWait = &c
	}
	for _, c := range d.cfg.Counters {
		if !d.keepable(c.Name) {
			s.Degraded = append(s.Degraded, c.Name)
		}
	}
	s.Reconcile = d.rec.Status()
	s.FreshReads = d.freshStatus()
	s.Events = d.eventsStatus(ctx)
	for _, c := range d.cfg.Counters {
		s.Counters = append(s.Counters, d.counterStatus(c.Name, c.Source, c.Target+"."+c.Column))
	}
	if p.w != 0 {
		s.Checkpoint = p.w.String()
	}
	if !p.movedAt.IsZero() {
		at := p.movedAt
		age := max(time.Since(at), 0).Seconds()
		s.LastFlush, s.CheckpointAge = &at, &age
	}
	if p.received != 0 {
		s.Received = p.received.String()
	}
	if !st.sessionStart.IsZero() {
		s.SessionStart = &st.sessionStart
	}
	if st.lastErr != nil {
		s.LastError = st.lastErr.Error()
		s.LastErrorAt = &st.lastErrAt
	}
	if d.mon != nil {
		if ss, ok := d.mon.Latest(); ok {
			s.SlotStatus = &ss
		}
	}
	return s
}

// counterStatus returns one counter's figures, as the stages that produce
// them counted them in the daemon's tally.
func (d *Daemon) counterStatus(name, source, target string) CounterStatus {
	c := CounterStatus{Name: name, Source: source, Target: target, Changes: make(map[string]int64, len(metrics.Ops))}
	for _, op := range metrics.Ops {
		c.Changes[op] = d.tally.Get(name, op)
	}
	c.DeltasFlushed = d.tally.Get(name, counter.TallyFlushed)
	c.DeltasDropped = d.tally.Get(name, counter.TallyDropped)
	c.Corrections = d.tally.Get(name, counter.TallyCorrections)
	return c
}

// gaugeValue reads a Prometheus gauge.
func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}

// Ready returns nil when the daemon streams, PostgreSQL and Redis answer
// and the slot's lag is within slot_monitor.max_lag_bytes; otherwise it
// returns every reason, joined.
func (d *Daemon) Ready(ctx context.Context) error {
	d.mu.Lock()
	streaming, waiting, lastErr, slotWait := d.state.streaming, d.state.waiting, d.state.lastErr, d.state.slotWait
	d.mu.Unlock()
	var errs []error
	if slotWait != nil {
		errs = append(errs, errors.New(slotWait.String()))
	}
	if !streaming {
		switch {
		case waiting:
			errs = append(errs, errors.New("not streaming: another walcount holds the slot"))
		case lastErr != nil:
			errs = append(errs, fmt.Errorf("not streaming: %w", lastErr))
		default:
			errs = append(errs, errors.New("not streaming yet"))
		}
	}
	if err := d.pool.Ping(ctx); err != nil {
		errs = append(errs, fmt.Errorf("postgres: %w", redactedError{err}))
	}
	if err := d.buf.Ping(ctx); err != nil {
		errs = append(errs, fmt.Errorf("redis: %w", redactedError{err}))
	}
	if d.mon != nil {
		if err := d.mon.LagOK(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
