package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/sink"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

func isSlotLost(err error) bool { return errors.Is(err, slot.ErrSlotLost) }

// session runs one replication session; see the package documentation.
// It returns nil only after a clean shutdown requested through ctx.
func (d *Daemon) session(ctx context.Context) error {
	s, err := d.openSession(ctx)
	if err != nil {
		return err
	}
	defer s.closeStream()
	d.sessionStarted(s)
	defer d.sessionEnded()
	if err := s.run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return errors.New("replication stream ended")
	}
	if cause := context.Cause(ctx); errors.Is(cause, failpoint.ErrCrash) {
		return cause // a simulated crash: no final flush
	}
	s.finalFlush(ctx)
	s.unstampBuffer(ctx)
	return nil
}

// liveSession is one session's parts, from openSession to its end.
type liveSession struct {
	d       *Daemon
	flusher *sink.Flusher
	stream  *cdc.Stream
	// start is where the buffer's chain ends: streaming skips every
	// transaction up to it (design rule 4).
	start cdc.LSN
	// gate holds W back until the standbys have it.
	gate *sink.StandbyGate
	// silence is the stream's cdc.StreamConfig.SilenceTimeout.
	silence time.Duration
	closed  bool
}

// checkSessionState refuses a session on a state schema of another
// version (it would be read or written wrongly), on a column another slot
// keeps (it would be counted twice) and on a target row that row-level
// security hides from the flush (it would look deleted, and its deltas
// would be dropped; a source's policies do not matter to the stream, only
// to reconciliation). rowSecurityOff says that no policy applies to
// walcount's role on any target: the flush then runs with row_security
// off, so that a policy enabled later fails a flush instead of hiding rows.
func (d *Daemon) checkSessionState(ctx context.Context) (rowSecurityOff bool, err error) {
	if err := state.CheckVersion(ctx, d.pool); err != nil {
		return false, err
	}
	if err := state.CheckOwnership(ctx, d.pool, d.cfg.Slot, d.cfg.Counters); err != nil {
		return false, err
	}
	rowSecurityOff = true
	for _, c := range d.cfg.Counters {
		if err := counter.CheckTargetView(ctx, d.pool, c); err != nil {
			return false, err
		}
		none, err := counter.NoRowSecurity(ctx, d.pool, c)
		if err != nil {
			return false, err
		}
		rowSecurityOff = rowSecurityOff && none
	}
	return rowSecurityOff, nil
}

// openSession checks the state schema, reads W, takes the slot (it fails
// with cdc.ErrSlotInUse while another walcount holds it) and makes Redis
// continue W (docs/design.md §4). Nothing is consumed yet.
func (d *Daemon) openSession(ctx context.Context) (*liveSession, error) {
	silence := d.streamTimeout(ctx)
	// An older state schema is migrated first, holding the slot
	// (upgrade.go): the stream is then already open.
	pre, err := d.upgradeState(ctx, silence)
	if err != nil {
		return nil, err
	}
	defer func() {
		if pre != nil {
			pre.Close() // the session did not take it over
		}
	}()
	rowSecurityOff, err := d.checkSessionState(ctx)
	if err != nil {
		return nil, err
	}
	flusher, err := sink.NewFlusher(ctx, sink.Options{
		Pool:       d.pool,
		Buffer:     d.buf,
		Slot:       d.cfg.Slot,
		Counters:   d.cfg.Counters,
		Lag:        d.lag,
		Metrics:    d.m,
		Tally:      d.tally,
		Logger:     d.log,
		Failpoints: d.opt.Failpoints,
		FlushLog:   d.flushes,
		Events:     d.events,
		// A policy enabled during the session makes a flush fail rather
		// than drop the rows it hides (see watchTargetViews).
		RowSecurityOff: rowSecurityOff,
		ParkRetry:      d.opt.ParkRetry,
		ChunkSize:      d.opt.FlushChunk,

		TransactionKeys: d.opt.FlushTransactionKeys,
		TransactionTime: cmp.Or(d.opt.FlushTransactionTime, d.cfg.FlushLockTime),
	})
	if err != nil {
		return nil, err
	}
	w := flusher.W()
	if d.opt.replayFromSlot {
		w = 0
	}
	stream := pre
	pre = nil
	if stream == nil {
		if stream, err = d.connectStream(ctx, w, silence); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	d.state.silentPID = 0
	d.mu.Unlock()
	s := &liveSession{d: d, flusher: flusher, stream: stream, silence: silence}
	// Every new W goes to the stream's next status update once the
	// standbys that must carry the slot have its flush (design rules 3
	// and 16), W read at the start included, even when the stream was
	// asked to start elsewhere (tests replaying from the slot's position).
	s.gate = sink.NewStandbyGate(d.pool, stream.Ack, d.log)
	if d.slotDB != d.pool {
		// Decoding on a hot standby: a W is confirmed only once the
		// standby replayed the flush that wrote it.
		var standby bool
		if err := d.slotDB.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
			stream.Close()
			return nil, fmt.Errorf("read pg_is_in_recovery() of the replication server: %w", err)
		}
		if standby {
			s.gate.WaitReplay(d.slotDB)
		}
	}
	flusher.SetAck(s.gate.Committed)
	s.gate.Committed(flusher.W())
	if s.start, err = d.recover(ctx, flusher, stream.History()); err != nil {
		s.closeStream()
		return nil, err
	}
	return s, nil
}

// connectStream takes the slot and starts streaming it from w. A slot in
// use fails with cdc.ErrSlotInUse (or, when the walsender that holds it is
// this daemon's own silent one, cdc.ErrStreamSilent), a lost one with the
// slot's own row's words.
func (d *Daemon) connectStream(ctx context.Context, w cdc.LSN, silence time.Duration) (*cdc.Stream, error) {
	stream, err := cdc.Connect(ctx, cdc.StreamConfig{
		ConnString:     d.cfg.ReplicationConnString(),
		Slot:           d.cfg.Slot,
		Publication:    d.cfg.Publication,
		StartLSN:       w,
		AckLater:       true,
		StatusInterval: d.opt.StatusInterval,
		ReceiveTimeout: d.opt.ReceiveTimeout,
		SilenceTimeout: silence,
		Observer:       streamObserver{d},
		Logger:         d.log,
		ConfirmingPast: func(w, to cdc.LSN) error {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			return d.buf.RecordIdleConfirm(ctx, w, to)
		},
	})
	if err != nil {
		// A lost slot fails START_REPLICATION with the server's words;
		// the slot's own row says what to do.
		if err := slot.StartError(ctx, d.slotDB, d.cfg.Slot, err); isSlotLost(err) {
			return nil, err
		}
		if errors.Is(err, cdc.ErrSlotInUse) {
			if held := d.takeBackSlot(ctx, err); held != nil {
				return nil, held
			}
		}
		return nil, err
	}
	return stream, nil
}

// closeStream sends the last status update and closes the replication
// connection, once.
func (s *liveSession) closeStream() {
	if !s.closed {
		s.closed = true
		s.stream.Close()
	}
}

// sessionStarted publishes a streaming session for /status, /readyz and
// the reconciler.
func (d *Daemon) sessionStarted(s *liveSession) {
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
	d.state.stream = s.stream
	d.state.gate = s.gate
	d.state.flusher = s.flusher
	d.state.sessionStart = time.Now()
	d.mu.Unlock()
	d.m.Streaming.Set(1)
	d.log.Info("streaming", zap.String("checkpoint", s.flusher.W().String()), zap.String("redis_lsn", s.start.String()),
		zap.Duration("stream_timeout", s.silence))
}

// sessionEnded withdraws what sessionStarted published.
func (d *Daemon) sessionEnded() {
	d.mu.Lock()
	d.state.streaming = false
	d.state.stream = nil
	d.state.gate = nil
	d.mu.Unlock()
	d.m.Streaming.Set(0)
}

// run consumes the stream until ctx asks for a clean shutdown or a part
// fails, and returns the first failure.
//
// Teardown order: ctx stops the stream alone; the aggregator drains what
// was received and writes it to Redis, then stops the flusher and the
// heartbeat. A failure of any part stops all of them at once, and nothing
// more is written: the next session replays from W.
func (s *liveSession) run(ctx context.Context) error {
	d := s.d
	rels, bound, err := d.bindRelations(ctx)
	if err != nil {
		return err
	}
	// Generated summed columns are not in the stream: derived from the
	// columns they are computed from.
	derived, err := counter.Derivations(ctx, d.pool, d.cfg.Counters)
	if err != nil {
		return err
	}
	// Dirty and degraded marks are written off the aggregator's
	// goroutine; it waits for them only before it hands the transactions
	// that caused them to Redis (aggregator.Marks).
	marks := newMarkWriter(d, d.writeMark)
	agg := aggregator.New(aggregator.Options{
		Slot:      d.cfg.Slot,
		Counters:  d.cfg.Counters,
		Relations: rels,
		Derived:   derived,
		Flushes:   d.flushes,
		Marks:     marks,
		// A counter degraded in an earlier session stays so until this
		// one sees its source's identity carry the column again.
		WasDegraded:    d.degradedCounters(),
		Buffer:         d.buf,
		Barrier:        s.flusher,
		Start:          s.start,
		Commits:        d.lag,
		Reconciliation: d.rec.Recorder(),
		Metrics:        d.m,
		Tally:          d.tally,
		Logger:         d.log,
		Failpoints:     d.opt.Failpoints,
		// A source transaction of more keys is written to Redis in
		// parts before its COMMIT, discarded by a restart before it.
		TransactionKeys: d.cfg.AggregatorTransactionKeys,
		Refusals:        &d.refusals,
	})
	g, gctx := errgroup.WithContext(context.WithoutCancel(ctx))
	streamCtx, stopStream := context.WithCancel(gctx)
	defer stopStream()
	defer context.AfterFunc(ctx, stopStream)()
	workCtx, stopWork := context.WithCancel(gctx)
	defer stopWork()
	s.stream.ConsumerGone(workCtx.Done())
	g.Go(func() error {
		err := s.stream.Run(streamCtx)
		if errors.Is(err, cdc.ErrStreamSilent) {
			d.mu.Lock()
			d.state.silentPID = s.stream.BackendPID()
			d.mu.Unlock()
			d.m.StreamTimeouts.Inc()
		}
		return err
	})
	g.Go(func() error {
		// The stream closed its output (drained) or a part failed: either
		// way the other workers are done.
		defer stopWork()
		return agg.Run(workCtx, s.stream.Batches(), s.stream.Release)
	})
	g.Go(func() error { return marks.run(workCtx) })
	g.Go(func() error { return s.flusher.Run(workCtx, d.cfg.FlushInterval) })
	g.Go(func() error { return s.gate.Run(workCtx) })
	g.Go(func() error { return d.watchRelations(workCtx, bound) })
	g.Go(func() error {
		d.heartbeat(workCtx, s.stream)
		return nil
	})
	g.Go(func() error {
		d.stampBuffer(workCtx, buffer.System(s.stream.History()))
		return nil
	})
	return g.Wait()
}

// finalFlush applies what a clean shutdown drained into Redis, bounded by
// ShutdownTimeout; closeStream then confirms the new W.
func (s *liveSession) finalFlush(ctx context.Context) {
	d := s.d
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opt.ShutdownTimeout)
	defer cancel()
	if _, err := s.flusher.Flush(fctx); err != nil {
		d.log.Warn("final flush failed; the next start resumes it", zap.Error(err))
		return
	}
	d.log.Info("final flush done", zap.String("checkpoint", s.flusher.W().String()))
}

// unstampBuffer removes the chain's stamp at a clean stop, so that a
// walcount of another system identifier (this cluster after pg_upgrade)
// need not wait buffer.AliveStale for it (docs/upgrade.md). A failure
// only costs that wait.
func (s *liveSession) unstampBuffer(ctx context.Context) {
	d := s.d
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sampleTimeout)
	defer cancel()
	if err := d.buf.MarkStopped(uctx, buffer.System(s.stream.History())); err != nil {
		d.log.Warn("could not remove the redis buffer's stamp; a walcount of another system identifier waits for it to age", zap.Error(err))
	}
}

// recover makes Redis continue W (docs/design.md §4): a missing chain, or one
// written against another server history, is reset to an empty one at W;
// an unfinished flush is resumed or, when it was already committed,
// discarded. It returns the end LSN of the last transaction Redis or
// PostgreSQL holds: streaming skips up to it.
func (d *Daemon) recover(ctx context.Context, f *sink.Flusher, history string) (cdc.LSN, error) {
	// Another cluster's walcount keeping the same keys is another
	// deployment, not a loss: resetting its buffer would make it reset
	// this one's in turn.
	if err := d.buf.CheckOwner(ctx, history, time.Now()); err != nil {
		return 0, err
	}
	// Change events stay off while walcount's Redis user may not run
	// their commands (a user set up before them): the counters go on.
	if err := d.events.Probe(ctx, f.W()); err != nil {
		return 0, err
	}
	meta, err := d.buf.Meta(ctx)
	if err != nil {
		return 0, err
	}
	if err := d.checkSlotPosition(ctx, f.W(), meta, history); err != nil {
		return 0, err
	}
	switch {
	case !meta.Exists:
		d.log.Info("no buffer in redis; starting an empty one at the checkpoint", zap.String(logLSN, f.W().String()))
		if err := d.resetChain(ctx, f.W(), history); err != nil {
			return 0, err
		}
	case meta.History != history:
		// A failover, a restored backup or another cluster: the same
		// LSNs may hold other transactions, so nothing buffered can be
		// trusted. Nothing past W was acknowledged: replay from W.
		d.log.Warn("redis buffer was written against another server history; discarding it and replaying from the checkpoint",
			zap.String("buffer_history", meta.History), zap.String("server_history", history), zap.String(logLSN, f.W().String()))
		if err := d.resetChain(ctx, f.W(), history); err != nil {
			return 0, err
		}
	case meta.Part != "":
		// A batch written in parts (one big transaction) was cut off:
		// its parts are in the buffer, the rest is not, and nothing can
		// tell them from the deltas around them. The slot still has it
		// all: replay from W.
		d.log.Warn("a big transaction was only partly written to the redis buffer; discarding it and replaying from the checkpoint",
			zap.String("part", meta.Part), zap.String(logLSN, f.W().String()))
		if err := d.resetChain(ctx, f.W(), history); err != nil {
			return 0, err
		}
	}
	if meta.Exists && meta.History == history {
		f.Inherit(meta.LSN)
	}
	// Before any flush of this session writes a column: the events a
	// crash kept from Redis, read back from the target rows at W.
	if _, err := f.RecoverEvents(ctx); err != nil {
		return 0, err
	}
	if _, err := f.Flush(ctx); err != nil {
		if !errors.Is(err, buffer.ErrChainBroken) {
			return 0, fmt.Errorf("resume flush: %w", err)
		}
		// Redis lost data or holds another history. Nothing past W was
		// acknowledged, so the slot still has it: replay from W.
		d.log.Warn("redis buffer does not continue the checkpoint; resetting it and replaying from the checkpoint",
			zap.Error(err), zap.String(logLSN, f.W().String()))
		f.Inherit(0)
		if err := d.resetChain(ctx, f.W(), history); err != nil {
			return 0, err
		}
	}
	if _, err := d.buf.MarkAlive(ctx, buffer.System(history), time.Now()); err != nil {
		return 0, err
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

// resetChain starts an empty chain at w (buffer.Redis.Reset) and
// publishes a gap entry at w to every change events stream: the outbox of
// the events of the flushes before may have gone with the buffer, so a
// consumer must read its keys again (docs/fresh-reads.md).
func (d *Daemon) resetChain(ctx context.Context, w cdc.LSN, history string) error {
	if err := d.buf.Reset(ctx, w, history); err != nil {
		return err
	}
	return d.events.Gap(ctx, w, "the redis chain was reset")
}

// checkSlotPosition compares the slot's confirmed position with W. The
// server resumes from the later of the two, so changes in between are never
// sent again: unless walcount itself confirmed past W with nothing in
// between (an idle stream letting PostgreSQL shut down, recorded in Redis),
// the slot was advanced by other means and those changes were never
// counted. Every counter is then marked dirty, to be reconciled (design
// rule 14).
func (d *Daemon) checkSlotPosition(ctx context.Context, w cdc.LSN, meta buffer.Meta, history string) error {
	st, err := slot.ReadSlot(ctx, d.slotDB, d.cfg.Slot)
	if err != nil || !st.Exists || st.ConfirmedFlushLSN <= w {
		return nil // the session reports an unreadable or missing slot itself
	}
	// The idle record counts across a failover too (same system, another
	// timeline): a slot synchronised to a standby is never past what that
	// standby flushed, so (W, confirmed] lies in the history both servers
	// share, which is the one the record was written against.
	if meta.Exists && sameSystem(meta.History, history) && meta.IdleFrom == w && meta.IdleTo >= st.ConfirmedFlushLSN {
		return nil
	}
	cause := fmt.Sprintf("the slot's confirmed position %s is past the checkpoint %s: the changes in between were never counted", st.ConfirmedFlushLSN, w)
	d.log.Warn("the replication slot was advanced past the checkpoint; marking every counter dirty", zap.String("cause", cause))
	for _, c := range d.cfg.Counters {
		if err := state.MarkDirty(ctx, d.pool, d.cfg.Slot, c.Name, nil, cause); err != nil {
			return err
		}
	}
	return nil
}

// sameSystem reports whether two histories ("<system identifier>/<timeline>")
// are of the same database system: one cluster and the standbys copied from
// it.
func sameSystem(a, b string) bool {
	sa, _, _ := strings.Cut(a, "/")
	sb, _, _ := strings.Cut(b, "/")
	return sa != "" && sa == sb
}

// heartbeat emits a logical message when nothing arrived on the stream
// for a heartbeat interval, so W and the slot move while the sources are
// idle and other tables fill the WAL (design rule 8).
func (d *Daemon) heartbeat(ctx context.Context, s *cdc.Stream) {
	last := s.ReceivedLSN()
	_ = everyTick(ctx, d.cfg.HeartbeatInterval, func() error {
		if cur := s.ReceivedLSN(); cur != last {
			last = cur
			return nil
		}
		content := fmt.Sprintf(`{"heartbeat":%q,"slot":%q}`, time.Now().UTC().Format(time.RFC3339Nano), d.cfg.Slot)
		if _, err := cdc.EmitMessage(ctx, d.pool, content); err != nil && ctx.Err() == nil {
			// The stream notices a dead server on its own; a failed
			// heartbeat only delays W.
			d.log.Warn("heartbeat failed", zap.Error(err))
		}
		return nil
	})
}

// stampBuffer marks the Redis chain as this deployment's every
// buffer.AliveInterval, so that the walcount of another cluster configured
// with the same Redis and slot name refuses to reset it (see
// buffer.CheckOwner). A failed stamp is retried at the next tick; a chain
// that is no longer this system's is the next Redis write's business.
func (d *Daemon) stampBuffer(ctx context.Context, sys string) {
	_ = everyTick(ctx, buffer.AliveInterval, func() error {
		rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
		_, _ = d.buf.MarkAlive(rctx, sys, time.Now())
		cancel()
		return nil
	})
}

// streamObserver exports the stream's progress.
type streamObserver struct{ d *Daemon }

func (o streamObserver) Received(lsn cdc.LSN) { o.d.m.ReceivedLSN.Set(float64(lsn)) }

func (o streamObserver) Blocked(dur time.Duration) {
	o.d.m.QueueBlockedSeconds.Add(dur.Seconds())
}

// streamTimeout returns the stream's silence bound: stream_timeout, or when
// it is 0 the server's wal_sender_timeout (cdc.SilenceBound), read now so
// that a changed server setting applies from the next session on.
func (d *Daemon) streamTimeout(ctx context.Context) time.Duration {
	if d.cfg.StreamTimeout > 0 {
		return d.cfg.StreamTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	var ms int64
	if err := d.slotDB.QueryRow(rctx, `SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&ms); err != nil {
		return cdc.SilenceBound(0)
	}
	return max(cdc.SilenceBound(time.Duration(ms)*time.Millisecond), config.MinStreamTimeout)
}

// takeBackSlot handles a slot found in use by the walsender of walcount's
// own stream that went silent: that walsender is stopped or cut off, not
// another walcount, so the daemon does not wait as a standby would. It asks
// PostgreSQL to end that walsender and returns an error that says so; nil
// when another process holds the slot.
func (d *Daemon) takeBackSlot(ctx context.Context, inUse error) error {
	d.mu.Lock()
	pid := d.state.silentPID
	d.mu.Unlock()
	if pid == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	if active, err := slot.ActivePID(rctx, d.slotDB, d.cfg.Slot); err != nil || active == nil || *active != int64(pid) {
		return nil
	}
	var ended bool
	terr := d.slotDB.QueryRow(rctx, `SELECT pg_terminate_backend($1)`, int64(pid)).Scan(&ended)
	msg := "asked PostgreSQL to end it (pg_terminate_backend)"
	if terr != nil {
		msg = fmt.Sprintf("could not end it (%v); it ends at wal_sender_timeout, or end it with SELECT pg_terminate_backend(%d)", terr, pid)
	}
	return fmt.Errorf("%w: the slot is still held by walsender pid %d of the stream that went silent; %s (%v)", cdc.ErrStreamSilent, pid, msg, inUse)
}
