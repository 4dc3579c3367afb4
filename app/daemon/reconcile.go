package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/sink"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// newReconciler builds the daemon's reconciler: it flushes through the
// current session and pauses while the stream is behind.
func (d *Daemon) newReconciler() *reconcile.Reconciler {
	// A nil interval means the default; zero disables scheduled runs.
	every := reconcile.DefaultInterval
	if d.cfg.Reconcile.Interval != nil {
		every = *d.cfg.Reconcile.Interval
	}
	return reconcile.New(reconcile.Options{
		Pool:             d.pool,
		Slot:             d.cfg.Slot,
		Counters:         d.cfg.Counters,
		BatchSize:        d.cfg.Reconcile.BatchSize,
		MaxKeysPerSecond: d.cfg.Reconcile.MaxKeysPerSecond,
		Interval:         every,
		Backfill:         true,
		Flush:            d.flushNow,
		Busy:             d.busy,
		Streaming:        d.streaming,
		Progress:         d.receivedLSN,
		Keepable:         d.keepable,
		Metrics:          d.m,
		Tally:            d.tally,
		Logger:           d.log,
		Failpoints:       d.opt.Failpoints,
	})
}

// receivedLSN is the current stream's received position, 0 between
// sessions.
func (d *Daemon) receivedLSN() cdc.LSN {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state.stream == nil {
		return 0
	}
	return d.state.stream.ReceivedLSN()
}

// streaming reports whether a session streams from the slot.
func (d *Daemon) streaming() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state.streaming
}

// degradedCounters returns the counters marked degraded.
func (d *Daemon) degradedCounters() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var names []string
	for name, degraded := range d.state.degraded {
		if degraded {
			names = append(names, name)
		}
	}
	return names
}

// keepable reports whether counter can be kept from the stream: false while
// its source's replica identity lacks a column it reads, a partition of
// its source is UNLOGGED, or its tables are not what the publication holds
// (relations.go).
func (d *Daemon) keepable(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, unbound := d.state.unbound[name]
	return !d.state.degraded[name] && len(d.state.unlogged[name]) == 0 && !unbound
}

// ReconcileHandler serves POST /v1/reconcile.
func (d *Daemon) ReconcileHandler() http.Handler { return d.rec.Handler() }

// ReconcileStatus returns the reconciliation state for /status.
func (d *Daemon) ReconcileStatus() reconcile.Status { return d.rec.Status() }

// flushNow makes the running session's flusher flush now. A failed flush
// ends the session, wherever it was asked for: the session restarts and
// recovers exactly as after its own.
func (d *Daemon) flushNow(ctx context.Context) error {
	d.mu.Lock()
	f, streaming := d.state.flusher, d.state.streaming
	d.mu.Unlock()
	if f == nil || !streaming {
		return reconcile.ErrNotStreaming
	}
	if err := f.Request(ctx); err != nil {
		if errors.Is(err, sink.ErrNotRunning) {
			return reconcile.ErrNotStreaming
		}
		return err
	}
	return nil
}

// busy reports that the stream is behind: batches wait between cdc and
// the aggregator.
func (d *Daemon) busy() bool {
	d.mu.Lock()
	s := d.state.stream
	d.mu.Unlock()
	return s != nil && s.QueueDepth() > 1
}

// markCountersDirty records whole counters as dirty, for reconciliation
// to measure every key (design rule 14).
func (d *Daemon) markCountersDirty(names []string, cause string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range names {
		if err := state.MarkDirty(ctx, d.pool, d.cfg.Slot, name, nil, cause); err != nil {
			return err
		}
		d.log.Warn("counter marked dirty: reconciliation will measure every key", zap.String("counter", name), zap.String("cause", cause))
	}
	return nil
}

// recreateSlot replaces a lost or missing slot (on_slot_loss: recreate):
// it drops what is left of it, creates it anew (a failover slot from
// PostgreSQL 17 on), then in one transaction moves W to the new slot's
// start and marks every counter dirty, since the changes in between were
// never seen; the Redis buffer belongs to the old history and goes. The
// reconciler then repairs the counters while the new slot streams. A crash
// between the slot's creation and that transaction leaves a slot past W,
// which the next start finds and marks dirty the same way
// (checkSlotPosition).
func (d *Daemon) recreateSlot(ctx context.Context, cause error) error {
	d.log.Warn("the replication slot is lost or missing; recreating it (on_slot_loss: recreate): every counter is marked dirty and reconciled",
		zap.Error(redactedError{cause}))
	// The dirty marks need a state schema of version 2 or later. No
	// walcount streams a lost slot, so this one may migrate an older
	// schema now (upgrade.go).
	if from, err := state.ReadVersion(ctx, d.pool); err == nil && from < state.Version {
		if err := d.migrate(ctx); err != nil {
			return err
		}
	}
	// The slot is dropped and made where it lives (d.slotDB, a hot
	// standby that decodes included); the checkpoint is on the primary.
	sconn, err := d.slotDB.Acquire(ctx)
	if err != nil {
		return err
	}
	defer sconn.Release()
	if err := slot.DropInactive(ctx, sconn, d.cfg.Slot); err != nil {
		return fmt.Errorf("drop the lost slot: %w", err)
	}
	var primary slot.Execer
	if d.slotDB != d.pool {
		primary = d.pool
	}
	stopWatch := d.watchSlotCreation(ctx, sconn.Conn().PgConn().PID())
	var lsn state.LSN
	err = slot.Create(ctx, sconn, primary, d.cfg.Slot, &lsn)
	stopWatch()
	if err != nil {
		return fmt.Errorf("create the slot: %w", err)
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := state.InitCheckpoint(ctx, tx, d.cfg.Slot, lsn, true); err != nil {
			return err
		}
		for _, c := range d.cfg.Counters {
			if err := state.MarkDirty(ctx, tx, d.cfg.Slot, c.Name, nil, "the replication slot was lost and recreated: changes made before it were not seen"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := d.buf.Drop(ctx); err != nil {
		return err
	}
	d.log.Info("recreated the replication slot", zap.String(logLSN, lsn.String()))
	return nil
}
