package slot

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/metrics"
)

const (
	// MinReadTimeout bounds one read of the slot's status when the poll
	// interval is shorter; a longer interval is the bound itself.
	MinReadTimeout = 5 * time.Second
	// LagWarnInterval is how often the warning about a slot lag above the
	// maximum is repeated while the lag stays above it.
	LagWarnInterval = 5 * time.Minute
	// ReadErrorLogInterval is how often the warning about failing reads is
	// repeated while they keep failing.
	ReadErrorLogInterval = time.Minute
)

// Log field keys.
const (
	fieldSlot        = "slot"
	fieldWALStatus   = "wal_status"
	fieldPrevious    = "previous_wal_status"
	fieldLagBytes    = "lag_bytes"
	fieldMaxLagBytes = "max_lag_bytes"
	fieldSafeWALSize = "safe_wal_size_bytes"
	fieldRetained    = "retained_wal_bytes"
	fieldFailures    = "consecutive_failures"
)

// Monitor polls a replication slot's status, exports it as metrics and keeps
// the latest reading for /status and /readyz.
//
// Run is the only goroutine that polls; calls of Run must not overlap, but
// one may follow another (the daemon watches the slot during its preflight
// checks and then for its lifetime). Latest and LagOK are safe to call from
// any goroutine.
type Monitor struct {
	keepLost bool
	q        Querier
	slot     string
	interval time.Duration
	maxLag   int64
	metrics  *metrics.Metrics
	log      *zap.Logger

	mu       sync.Mutex
	latest   SlotStatus
	haveRead bool
	lastErr  error // of the last read; nil after a success

	// Logging state, owned by the Run goroutine.
	prevExists      bool
	prevWALStatus   string
	prevInvalidated bool
	lagHigh         bool
	lagWarnedAt     time.Time
	failures        int
	failLoggedAt    time.Time
}

// Defaults of Options.
const (
	// DefaultPollInterval is how often pg_replication_slots is read.
	DefaultPollInterval = 5 * time.Second
	// DefaultMaxLagBytes is the slot lag above which LagOK (and /readyz)
	// fails.
	DefaultMaxLagBytes = 1 << 30
)

// Options configure a Monitor.
type Options struct {
	// Querier reads the slot. Pass a pool (not one connection): it
	// survives a server restart.
	Querier Querier
	// Slot is the slot's name.
	Slot string
	// Interval between reads; zero means DefaultPollInterval.
	Interval time.Duration
	// MaxLagBytes is the lag above which LagOK fails; zero or less
	// disables the lag check.
	MaxLagBytes int64
	// Metrics receives the readings; nil means a private set.
	Metrics *metrics.Metrics
	// Logger: nil means no logging.
	Logger *zap.Logger
	// KeepWatchingLostSlot makes Run go on polling a lost slot instead of
	// returning its *SlotLostError: the daemon recreates the slot itself
	// (on_slot_loss: recreate) and the monitor must see the new one.
	KeepWatchingLostSlot bool
}

// New returns a Monitor of opt.Slot.
func New(opt Options) *Monitor {
	if opt.Interval <= 0 {
		opt.Interval = DefaultPollInterval
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	return &Monitor{
		keepLost: opt.KeepWatchingLostSlot,
		q:        opt.Querier,
		slot:     opt.Slot,
		interval: opt.Interval,
		maxLag:   opt.MaxLagBytes,
		metrics:  opt.Metrics,
		log:      opt.Logger.With(zap.String(fieldSlot, opt.Slot)),
		// The slot is assumed to exist and be reserved until a reading says
		// otherwise, so that the first reading of a healthy slot logs
		// nothing.
		prevExists:    true,
		prevWALStatus: WALReserved,
	}
}

// Run reads the slot's status at once and then every interval until ctx is
// done, when it returns nil. It returns a *SlotLostError (wrapping
// ErrSlotLost) as soon as the slot is invalidated: walcount must stop then
// (design rule 12).
//
// A failed read is not fatal: it is counted in
// walcount_slot_read_errors_total, logged (at most once per
// ReadErrorLogInterval while the failures last) and kept for LagOK, which
// reports the status as unknown once the last good reading is too old. A slot
// that does not exist is not fatal either: it is logged and makes LagOK fail,
// but the authority on whether the stream can go on is the replication
// connection, which fails on its own with the server's error.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		if err := m.poll(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// poll takes one reading; it returns an error only when the slot is lost.
func (m *Monitor) poll(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, max(m.interval, MinReadTimeout))
	s, err := ReadSlot(rctx, m.q, m.slot)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // shutting down, not a failure of the server
		}
		m.readFailed(err)
		return nil
	}
	m.readSucceeded()

	m.mu.Lock()
	m.latest, m.haveRead, m.lastErr = s, true, nil
	m.mu.Unlock()

	m.export(s)
	m.logTransitions(s)
	if s.Exists && s.Invalidated && !m.keepLost {
		return s.Err()
	}
	return nil
}

func (m *Monitor) readFailed(err error) {
	m.metrics.SlotReadErrors.Inc()
	m.mu.Lock()
	m.lastErr = err
	m.mu.Unlock()

	m.failures++
	now := time.Now()
	if m.failures == 1 || now.Sub(m.failLoggedAt) >= ReadErrorLogInterval {
		m.failLoggedAt = now
		m.log.Warn("cannot read replication slot status", zap.Error(err), zap.Int(fieldFailures, m.failures))
	}
}

func (m *Monitor) readSucceeded() {
	if m.failures > 0 {
		m.log.Info("replication slot status readable again", zap.Int(fieldFailures, m.failures))
		m.failures = 0
	}
}

// export copies a reading into the metrics.
func (m *Monitor) export(s SlotStatus) {
	mt := m.metrics
	mt.SlotLagBytes.Set(float64(s.LagBytes))
	mt.SlotRetainedWALBytes.Set(float64(s.RetainedWALBytes))
	if s.SafeWALSizeBytes != nil {
		mt.SlotSafeWALSizeBytes.Set(float64(*s.SafeWALSizeBytes))
	} else {
		mt.SlotSafeWALSizeBytes.Set(-1)
	}
	mt.SlotActive.Set(boolFloat(s.Active))
	status := s.WALStatus
	if s.Exists && s.Invalidated {
		// An invalidated slot whose wal_status is NULL is as lost as one
		// that says "lost"; the alert on status="lost" must fire for both.
		status = metrics.WALStatusLost
	}
	mt.SetWALStatus(status)
	reason := s.InvalidationReason
	if reason == "" && s.Invalidated && s.WALStatus == WALLost {
		// Before PostgreSQL 17 the only way a primary loses a slot is
		// WAL removal, which 17 calls wal_removed.
		reason = walRemoved
	}
	mt.SetSlotInvalidated(s.Exists && s.Invalidated, reason)
	mt.SlotSpillTxns.Set(float64(s.SpillTxns))
	mt.SlotSpillBytes.Set(float64(s.SpillBytes))
	mt.SlotStreamTxns.Set(float64(s.StreamTxns))
	mt.SlotStreamBytes.Set(float64(s.StreamBytes))
}

// logTransitions logs what an operator must hear about: once per change of
// existence and of wal_status, and, while the lag is above the maximum, at
// most once per LagWarnInterval.
func (m *Monitor) logTransitions(s SlotStatus) {
	if s.Exists != m.prevExists {
		m.prevExists = s.Exists
		if !s.Exists {
			if m.keepLost {
				m.log.Error("replication slot does not exist; walcount recreates it and reconciles every counter (on_slot_loss: recreate)")
			} else {
				m.log.Error("replication slot does not exist; run `walcount setup`")
			}
			return
		}
		m.log.Info("replication slot exists again")
	}
	if !s.Exists {
		return
	}

	if s.WALStatus != m.prevWALStatus {
		fields := []zap.Field{
			zap.String(fieldWALStatus, s.WALStatus), zap.String(fieldPrevious, m.prevWALStatus),
			zap.Int64(fieldRetained, s.RetainedWALBytes), safeWALSizeField(s.SafeWALSizeBytes),
		}
		m.prevWALStatus = s.WALStatus
		switch s.WALStatus {
		case WALUnreserved:
			m.log.Error("REPLICATION SLOT ABOUT TO BE LOST: its WAL is no longer reserved and the next "+
				"checkpoint may remove it; walcount must catch up now, or max_slot_wal_keep_size be raised", fields...)
		case WALExtended:
			m.log.Warn("replication slot retains more WAL than max_wal_size; it is safe while within max_slot_wal_keep_size", fields...)
		case WALReserved:
			m.log.Info("replication slot WAL reserved again", fields...)
		}
	}
	if s.Invalidated {
		if !m.prevInvalidated {
			m.log.Error("replication slot lost", zap.Error(s.Err()))
		}
		m.prevInvalidated = true
		return
	}
	m.prevInvalidated = false

	if m.maxLag <= 0 {
		return
	}
	now := time.Now()
	switch high := s.LagBytes > m.maxLag; {
	case high && (!m.lagHigh || now.Sub(m.lagWarnedAt) >= LagWarnInterval):
		m.lagHigh, m.lagWarnedAt = true, now
		m.log.Warn("replication slot lag above the maximum; walcount is falling behind and the server keeps the WAL",
			zap.Int64(fieldLagBytes, s.LagBytes), zap.Int64(fieldMaxLagBytes, m.maxLag))
	case !high && m.lagHigh:
		m.lagHigh = false
		m.log.Info("replication slot lag back under the maximum",
			zap.Int64(fieldLagBytes, s.LagBytes), zap.Int64(fieldMaxLagBytes, m.maxLag))
	}
}

// Latest returns the last successful reading; false when there has been none.
func (m *Monitor) Latest() (SlotStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.latest, m.haveRead
}

// LagOK returns nil when the last reading is recent and shows a slot that
// exists, is not lost, and lags at most maxLag bytes behind the server.
// Otherwise the error says which, and wraps ErrNotRead, ErrSlotNotFound,
// ErrSlotLost or ErrLagTooHigh. It is meant for /readyz.
//
// A reading counts as recent for two poll intervals plus one read timeout, so
// that a single failed read does not flap readiness but a server that stays
// unreachable does.
func (m *Monitor) LagOK() error {
	m.mu.Lock()
	s, have, lastErr := m.latest, m.haveRead, m.lastErr
	m.mu.Unlock()

	if !have {
		if lastErr != nil {
			return fmt.Errorf("%w: %w", ErrNotRead, lastErr)
		}
		return fmt.Errorf("%w: replication slot %q not read yet", ErrNotRead, m.slot)
	}
	if age := time.Since(s.ReadAt); age > 2*m.interval+max(m.interval, MinReadTimeout) {
		err := fmt.Errorf("%w: last read of replication slot %q was %s ago", ErrNotRead, m.slot, age.Round(time.Second))
		if lastErr != nil {
			err = fmt.Errorf("%w: %w", err, lastErr)
		}
		return err
	}
	if err := s.Err(); err != nil {
		return err
	}
	if m.maxLag > 0 && s.LagBytes > m.maxLag {
		return fmt.Errorf("%w: replication slot %q lags %d bytes behind the server (max %d)",
			ErrLagTooHigh, m.slot, s.LagBytes, m.maxLag)
	}
	return nil
}

func safeWALSizeField(n *int64) zap.Field {
	if n == nil {
		return zap.String(fieldSafeWALSize, "unlimited")
	}
	return zap.Int64(fieldSafeWALSize, *n)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
