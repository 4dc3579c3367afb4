package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/walcount/walcount/monitor"
)

// Status is the daemon's view, served as JSON at /status.
type Status struct {
	Slot           string              `json:"slot"`
	Publication    string              `json:"publication"`
	Streaming      bool                `json:"streaming"`
	WaitingForSlot bool                `json:"waiting_for_slot"`
	Checkpoint     string              `json:"checkpoint_lsn,omitempty"`
	Received       string              `json:"received_lsn,omitempty"`
	LastFlush      *time.Time          `json:"last_flush,omitempty"`
	BufferKeys     *int64              `json:"buffer_keys,omitempty"`
	SessionStart   *time.Time          `json:"session_start,omitempty"`
	LastError      string              `json:"last_error,omitempty"`
	LastErrorAt    *time.Time          `json:"last_error_at,omitempty"`
	Failures       int                 `json:"consecutive_failures"`
	Counters       []string            `json:"counters"`
	SlotStatus     *monitor.SlotStatus `json:"slot_status,omitempty"`
	Reconcile      any                 `json:"reconcile,omitempty"`
}

// Status returns the daemon's current view.
func (d *Daemon) Status(ctx context.Context) Status {
	d.mu.Lock()
	st := d.state
	d.mu.Unlock()
	s := Status{
		Slot:           d.cfg.Slot,
		Publication:    d.cfg.Publication,
		Streaming:      st.streaming,
		WaitingForSlot: st.waiting,
		Failures:       st.failures,
	}
	for _, c := range d.cfg.Counters {
		s.Counters = append(s.Counters, c.Name)
	}
	if st.flusher != nil {
		s.Checkpoint = st.flusher.W().String()
		if t := st.flusher.LastFlush(); !t.IsZero() {
			s.LastFlush = &t
		}
	}
	if st.stream != nil {
		s.Received = st.stream.ReceivedLSN().String()
	}
	if !st.sessionStart.IsZero() {
		s.SessionStart = &st.sessionStart
	}
	if st.lastErr != nil {
		s.LastError = st.lastErr.Error()
		s.LastErrorAt = &st.lastErrAt
	}
	if n, err := d.buf.Len(ctx); err == nil {
		s.BufferKeys = &n
		d.m.BufferKeys.Set(float64(n))
	}
	if d.mon != nil {
		if ss, ok := d.mon.Latest(); ok {
			s.SlotStatus = &ss
		}
	}
	return s
}

// Ready returns nil when the daemon streams, PostgreSQL and Redis answer
// and the slot's lag is within slot.max_lag_bytes.
func (d *Daemon) Ready(ctx context.Context) error {
	d.mu.Lock()
	streaming, waiting, lastErr := d.state.streaming, d.state.waiting, d.state.lastErr
	d.mu.Unlock()
	var errs []error
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
	if err := d.rdb.Ping(ctx).Err(); err != nil {
		errs = append(errs, fmt.Errorf("redis: %w", err))
	}
	if d.mon != nil {
		if err := d.mon.LagOK(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
