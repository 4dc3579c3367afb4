package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/monitor"
	"github.com/walcount/walcount/sink"
	"github.com/walcount/walcount/state"
)

func isSlotLost(err error) bool { return errors.Is(err, monitor.ErrSlotLost) }

// session runs one replication session; see the package documentation.
// It returns nil only after a clean shutdown requested through ctx.
func (d *Daemon) session(ctx context.Context) error {
	// A schema of another version would be read or written wrongly.
	if err := state.CheckVersion(ctx, d.pool); err != nil {
		return err
	}
	flusher, err := sink.NewFlusher(ctx, sink.Options{
		Pool:       d.pool,
		Buffer:     d.buf,
		Slot:       d.cfg.Slot,
		Counters:   d.cfg.Counters,
		Lag:        d.lag,
		Metrics:    d.m,
		Logger:     d.log,
		Failpoints: d.opt.Failpoints,
	})
	if err != nil {
		return err
	}
	w := flusher.W()
	if d.opt.replayFromSlot {
		w = 0
	}
	stream, err := cdc.Connect(ctx, cdc.StreamConfig{
		ConnString:     d.cfg.DatabaseURL,
		Slot:           d.cfg.Slot,
		Publication:    d.cfg.Publication,
		StartLSN:       w,
		StatusInterval: d.opt.StatusInterval,
		ReceiveTimeout: d.opt.ReceiveTimeout,
		Observer:       streamObserver{d},
		Logger:         d.log,
	})
	if err != nil {
		if lost := d.checkSlotLost(ctx, err); lost != nil {
			return lost
		}
		return err
	}
	closed := false
	closeStream := func() {
		if !closed {
			closed = true
			stream.Close()
		}
	}
	defer closeStream()
	flusher.SetAck(stream.Ack)
	// The stream confirms W from the start, even when it was asked to
	// start elsewhere (tests replaying from the slot's position).
	stream.Ack(flusher.W())

	start, err := d.recover(ctx, flusher)
	if err != nil {
		return err
	}
	d.lag.Reset()
	// Measurements in flight relied on the old session's recording.
	d.rec.Recorder().NewSession()
	d.mu.Lock()
	if d.state.failures > 0 || d.state.waiting {
		d.log.Info("recovered: streaming again", zap.Int("after_failures", d.state.failures))
	}
	d.state.failures = 0
	d.state.waiting = false
	d.state.streaming = true
	d.state.stream = stream
	d.state.flusher = flusher
	d.state.sessionStart = time.Now()
	d.mu.Unlock()
	d.m.Streaming.Set(1)
	d.log.Info("streaming", zap.String("checkpoint", flusher.W().String()), zap.String("redis_lsn", start.String()))
	defer func() {
		d.mu.Lock()
		d.state.streaming = false
		d.state.stream = nil
		d.mu.Unlock()
		d.m.Streaming.Set(0)
	}()

	agg := aggregator.New(aggregator.Options{
		Counters:   d.cfg.Counters,
		Buffer:     d.buf,
		Barrier:    flusher,
		Start:      start,
		Commits:    d.lag,
		Messages:   d.rec.Recorder().HandleMessage,
		Observe:    d.rec.Recorder().Observe,
		Metrics:    d.m,
		Logger:     d.log,
		Failpoints: d.opt.Failpoints,
	})

	// The stream stops when ctx does; the workers keep going until they
	// are told, so that what was received is drained and flushed.
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()

	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		aggDone  = make(chan struct{})
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		stopStream()
		stopWork()
	}
	d.mu.Lock()
	d.state.failSession = fail
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.state.failSession = nil
		d.mu.Unlock()
	}()
	wg.Go(func() {
		if err := stream.Run(streamCtx); err != nil {
			fail(err)
		}
	})
	wg.Go(func() {
		if err := agg.Run(workCtx, stream.Batches(), stream.Release); err != nil {
			fail(err)
			return
		}
		close(aggDone)
	})
	wg.Go(func() {
		if err := flusher.Run(workCtx, d.cfg.FlushInterval); err != nil {
			fail(err)
		}
	})
	wg.Go(func() { d.heartbeat(workCtx, stream) })

	select {
	case <-aggDone:
	case <-workCtx.Done():
	}
	stopWork()
	wg.Wait()
	// fail may also be called by a flush outside wg (reconciliation): a
	// no-op Do waits for it and publishes firstErr.
	errOnce.Do(func() {})
	if firstErr != nil {
		return firstErr
	}
	if ctx.Err() == nil {
		return errors.New("replication stream ended")
	}
	// Clean shutdown: everything received is in Redis; flush it and
	// confirm the new W before closing the connection.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opt.ShutdownTimeout)
	defer cancel()
	if _, err := flusher.Flush(fctx); err != nil {
		d.log.Warn("final flush failed; the next start resumes it", zap.Error(err))
	} else {
		d.log.Info("final flush done", zap.String("checkpoint", flusher.W().String()))
	}
	closeStream()
	return nil
}

// recover makes Redis continue W (DESIGN §4): a missing or foreign chain
// is reset to an empty one at W; an unfinished flush is resumed or, when
// it was already committed, discarded. It returns the end LSN of the last
// transaction Redis or PostgreSQL holds: streaming skips up to it.
func (d *Daemon) recover(ctx context.Context, f *sink.Flusher) (cdc.LSN, error) {
	meta, err := d.buf.Meta(ctx)
	if err != nil {
		return 0, err
	}
	if !meta.Exists {
		d.log.Info("no buffer in redis; starting an empty one at the checkpoint", zap.String(logLSN, f.W().String()))
		if err := d.buf.Reset(ctx, f.W()); err != nil {
			return 0, err
		}
	}
	if _, err := f.Flush(ctx); err != nil {
		if !errors.Is(err, buffer.ErrChainBroken) {
			return 0, fmt.Errorf("resume flush: %w", err)
		}
		// Redis lost data or holds another history. Nothing past W was
		// acknowledged, so the slot still has it: replay from W.
		d.log.Warn("redis buffer does not continue the checkpoint; resetting it and replaying from the checkpoint",
			zap.Error(err), zap.String(logLSN, f.W().String()))
		if err := d.buf.Reset(ctx, f.W()); err != nil {
			return 0, err
		}
	}
	meta, err = d.buf.Meta(ctx)
	if err != nil {
		return 0, err
	}
	if meta.LSN < f.W() {
		return 0, fmt.Errorf("recover: %w: redis is at %s, behind the checkpoint %s", buffer.ErrChainBroken, meta.LSN, f.W())
	}
	return meta.LSN, nil
}

// heartbeat emits a logical message when nothing arrived on the stream
// for a heartbeat interval, so W and the slot move while the sources are
// idle and other tables fill the WAL (DESIGN §2 rule 8).
func (d *Daemon) heartbeat(ctx context.Context, s *cdc.Stream) {
	t := time.NewTicker(d.cfg.HeartbeatInterval)
	defer t.Stop()
	last := s.ReceivedLSN()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cur := s.ReceivedLSN(); cur != last {
			last = cur
			continue
		}
		content := fmt.Sprintf(`{"heartbeat":%q,"slot":%q}`, time.Now().UTC().Format(time.RFC3339Nano), d.cfg.Slot)
		if _, err := cdc.EmitMessage(ctx, d.pool, content); err != nil && ctx.Err() == nil {
			// The stream notices a dead server on its own; a failed
			// heartbeat only delays W.
			d.log.Warn("heartbeat failed", zap.Error(err))
		}
	}
}

// checkSlotLost turns a failed START_REPLICATION on a lost slot into
// monitor's SlotLostError.
func (d *Daemon) checkSlotLost(ctx context.Context, cause error) error {
	st, err := monitor.ReadSlot(ctx, d.pool, d.cfg.Slot)
	if err != nil {
		return nil
	}
	if lost := st.Err(); lost != nil {
		return fmt.Errorf("%w (start replication: %v)", lost, cause)
	}
	return nil
}

// streamObserver exports the stream's progress.
type streamObserver struct{ d *Daemon }

func (o streamObserver) Received(lsn cdc.LSN) { o.d.m.ReceivedLSN.Set(float64(lsn)) }

func (o streamObserver) Blocked(dur time.Duration) {
	o.d.m.QueueBlockedSeconds.Add(dur.Seconds())
}
