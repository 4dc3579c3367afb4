package cdc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// receiver is the state of one Run, owned by its goroutine.
type receiver struct {
	s     *Stream
	ctx   context.Context
	nc    net.Conn
	dec   *Decoder
	batch *Batch
	// sentAck is the W the last status update carried, nextStatus when
	// the next one is due even if W does not move; statusEvery is the
	// interval between them.
	sentAck     LSN
	nextStatus  time.Time
	statusEvery time.Duration
	// heard is when the last message arrived, or when the stream last
	// started listening again after a blocked hand-over.
	heard time.Time
	// deadline is the socket's read deadline.
	deadline  time.Time
	stopWatch func() bool
	co        coalescer
}

// newReceiver prepares the connection for Run. Receives use the socket's
// read deadline, not a context per message: a context costs an allocation
// and a watcher goroutine hand-off per message. A cancelled ctx expires
// the deadline at once; a timeout leaves the connection usable and a
// partly read message resumes.
func (s *Stream) newReceiver(ctx context.Context) *receiver {
	nc := s.conn.Conn()
	now := time.Now()
	r := &receiver{
		s:           s,
		ctx:         ctx,
		nc:          nc,
		dec:         s.newDecoder(),
		batch:       s.newBatch(),
		nextStatus:  now,
		statusEvery: s.cfg.StatusInterval,
		heard:       now,
		stopWatch:   context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Now()) }),
	}
	if t := s.cfg.SilenceTimeout; t > 0 {
		r.statusEvery = min(r.statusEvery, t/3)
	}
	r.co = newCoalescer(nc, s.cfg.CoalesceWindow)
	return r
}

// close undoes newReceiver, so that Close can read the end of the stream.
func (r *receiver) close() {
	r.stopWatch()
	r.co.off()
	_ = r.nc.SetReadDeadline(time.Time{})
}

// stop ends a Run that ctx stopped. What was received goes to the
// consumer, which drains the queue on a clean stop, so a shutdown flushes
// it; a full queue means a consumer far behind, and the rest is replayed
// from W at the next start (design rule 3: nothing past W was confirmed).
func (r *receiver) stop() error {
	if len(r.batch.Events) > 0 {
		// The consumer drains until Run closes its output, so wait for it
		// to take what was received: dropped, the last changes before a
		// SIGTERM missed the final flush (replayed at the next start, but
		// a clean stop promises them flushed; TestRunStopsCleanlyOnSIGTERM
		// failed so on a busy machine, the queue full). A consumer that
		// is gone takes nothing: the batch goes at once, or after
		// stopHandOver when nothing says the consumer is gone.
		t := time.NewTimer(stopHandOver)
		defer t.Stop()
		select {
		case r.s.out <- r.batch:
		case <-r.s.consumerGone:
		case <-t.C:
			r.s.log.Warn("stopping: the consumer did not take the last received changes; the next start replays them",
				zap.Int("events", len(r.batch.Events)))
		}
	}
	_ = r.s.sendStatus(false, false)
	return nil
}

// stopHandOver bounds how long a stopping Run waits for the consumer to
// take its last batch.
const stopHandOver = 10 * time.Second

// statusIfDue sends a standby status update when W moved or the status
// interval passed, so the server learns W promptly and never times the
// connection out (design rule 9). A timed update sent after a status
// interval in which nothing arrived asks the server for a reply: a healthy
// walsender answers it with a keepalive, so a stream that stays silent past
// SilenceTimeout is one whose server or network path is gone.
func (r *receiver) statusIfDue() error {
	now := time.Now()
	if acked := r.s.Acked(); acked != r.sentAck || !now.Before(r.nextStatus) {
		ping := !now.Before(r.nextStatus) && now.Sub(r.heard) >= r.statusEvery
		if err := r.s.sendStatus(false, ping); err != nil {
			return err
		}
		r.sentAck = acked
		r.nextStatus = now.Add(r.statusEvery)
	}
	return nil
}

// setDeadline sets the read deadline to the nearest of: the receive
// timeout, the next status update, the end of the coalescing window, and,
// for a finished transaction waiting to join a batch, the linger.
func (r *receiver) setDeadline() error {
	now := time.Now()
	want := now.Add(r.s.cfg.ReceiveTimeout)
	if r.nextStatus.Before(want) {
		want = r.nextStatus
	}
	if r.co.on {
		if r.co.windowEnd.Before(want) {
			want = r.co.windowEnd
		}
	} else if n := len(r.batch.Events); n > 0 && r.batch.Events[n-1].Kind == KindCommit {
		// A finished transaction waits at most a millisecond for more to
		// join its batch: under load batches fill up, a lone transaction
		// goes on at once.
		want = now.Add(handOverLinger)
	}
	// Setting a deadline is cheap but not free: keep one until it passes
	// or a nearer one is wanted.
	if !now.Before(r.deadline) || want.Before(r.deadline) {
		r.deadline = want
		if err := r.nc.SetReadDeadline(r.deadline); err != nil {
			return fmt.Errorf("set receive deadline: %w", err)
		}
	}
	return nil
}

// quiet handles a receive that timed out: nothing (more) arrived in time,
// so what is decoded goes to the consumer, which a half-full batch must
// not starve, and the coalescing window may end. A silence longer than
// SilenceTimeout ends the stream.
func (r *receiver) quiet() error {
	if len(r.batch.Events) > 0 {
		var err error
		if r.batch, err = r.handOver(r.batch); err != nil {
			return err
		}
	}
	r.co.windowPassed()
	if t := r.s.cfg.SilenceTimeout; t > 0 {
		if silent := time.Since(r.heard); silent > t {
			r.s.dead = true
			return fmt.Errorf("%w: nothing received from walsender pid %d for %s, not even a keepalive (stream_timeout %s); abandoning the connection",
				ErrStreamSilent, r.s.BackendPID(), silent.Round(time.Millisecond), t)
		}
	}
	return nil
}

// handOver is Stream.handOver for the receive loop: the time a hand-over
// waited for the consumer was spent not listening, so it is no silence of
// the server's.
func (r *receiver) handOver(b *Batch) (*Batch, error) {
	start := time.Now()
	nb, err := r.s.handOver(r.ctx, b)
	if time.Since(start) > r.s.cfg.ReceiveTimeout {
		r.heard = time.Now()
	}
	return nb, err
}

// dispatch handles one message of the COPY BOTH stream.
func (r *receiver) dispatch(msg pgproto3.BackendMessage) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return nil
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			return r.keepalive(msg.Data[1:])
		case pglogrepl.XLogDataByteID:
			// Only WAL data starts a coalescing window: the keepalive
			// that asks for a reply as the stream starts, or one on an
			// idle stream, comes alone.
			r.co.arrived()
			return r.walData(msg.Data[1:])
		}
	case *pgproto3.ErrorResponse:
		return streamError(r.s.cfg.Slot, r.s.cfg.Publication, pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return errors.New("replication stream: server ended the stream")
	}
	return nil
}

// keepalive answers a keepalive that asks for a reply at once, even while
// the consumer is slow (design rule 9), and remembers the server's sent
// position for sendStatus.
func (r *receiver) keepalive(data []byte) error {
	ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data)
	if err != nil {
		return fmt.Errorf("parse keepalive: %w", err)
	}
	r.s.idleEnd = ka.ServerWALEnd
	if ka.ReplyRequested {
		if err := r.s.sendStatus(true, false); err != nil {
			return err
		}
		r.sentAck = r.s.Acked()
		r.nextStatus = time.Now().Add(r.statusEvery)
	}
	return nil
}

// walData decodes one pgoutput message into the batch and hands a full
// batch over. Receiving it never acknowledges it (design rule 3).
func (r *receiver) walData(data []byte) error {
	xld, err := pglogrepl.ParseXLogData(data)
	if err != nil {
		return fmt.Errorf("parse xlogdata: %w", err)
	}
	s := r.s
	before := len(r.batch.Events)
	if err := r.dec.Decode(xld.WALData, r.batch); err != nil {
		return fmt.Errorf("decode wal at %s: %w", xld.WALStart, err)
	}
	s.idleEnd = 0
	if n := len(r.batch.Events); n > before {
		for i := before; i < n; i++ {
			r.batch.content += int64(len(r.batch.Events[i].Content))
		}
		switch ev := &r.batch.Events[n-1]; ev.Kind {
		case KindBegin:
			s.inTxn = true
		case KindCommit:
			s.inTxn, s.lastCommit = false, ev.LSN
		case KindMessage:
			if ev.Trusted {
				// A message row's position: the insert's WAL record,
				// which the walsender puts in the header.
				ev.LSN = xld.WALStart
			}
		}
	}
	end := xld.WALStart + LSN(len(xld.WALData))
	if uint64(end) > s.recv.Load() {
		s.recv.Store(uint64(end))
	}
	if s.cfg.Observer != nil {
		s.cfg.Observer.Received(end)
	}
	if len(r.batch.Events) >= s.cfg.BatchEvents || r.batch.bytes() >= s.cfg.BatchBytes {
		if r.batch, err = r.handOver(r.batch); err != nil {
			return err
		}
	}
	return nil
}

// handOver sends b downstream and returns a fresh batch. While the
// consumer is slow it blocks (backpressure), but keeps sending status
// updates so the server does not time the connection out, and logs the
// stall once.
func (s *Stream) handOver(ctx context.Context, b *Batch) (*Batch, error) {
	b.charged = b.bytes()
	admitted := s.admit(b.charged)
	if admitted {
		select {
		case s.out <- b:
			return s.newBatch(), nil
		default:
		}
	}
	start := time.Now()
	logged := false
	tick := time.NewTicker(s.cfg.StatusInterval / 2)
	defer tick.Stop()
	defer func() {
		if s.cfg.Observer != nil {
			s.cfg.Observer.Blocked(time.Since(start))
		}
	}()
	for {
		if !admitted {
			admitted = s.admit(b.charged)
		}
		var out chan<- *Batch // nil, so never ready, until admitted
		if admitted {
			out = s.out
		}
		select {
		case out <- b:
			return s.newBatch(), nil
		case <-s.released:
		case <-ctx.Done():
			if admitted {
				s.queued.Add(-b.charged)
			}
			return b, nil // Run notices ctx and stops
		case <-tick.C:
			if !logged {
				s.log.Warn("consumer is slow; replication reading is paused (backpressure)",
					zap.Duration("blocked_for_seconds", time.Since(start)), zap.Int("queue", cap(s.out)),
					zap.Int64("queue_bytes", s.queued.Load()))
				logged = true
			}
			if err := s.sendStatus(false, false); err != nil {
				return b, err
			}
		}
	}
}

// sendStatus sends a standby status update. Write is the received
// position; flush and apply are W, set explicitly because pglogrepl copies
// the write position into a zero flush field (design rule 3).
//
// One refinement of rule 3, only in the answer to a keepalive that asks
// for a reply (answer): when that keepalive said the server has sent
// everything up to some position, no data followed it, no transaction is
// open and W covers the last COMMIT received, then the WAL between W and
// that position holds nothing for walcount, and the flush position is
// that position. Without it, PostgreSQL's fast shutdown, which waits for
// the walsender's client to confirm all WAL sent (and asks for replies
// until it does), would wait forever for a walcount that only ever
// confirms W. Only then: a slot confirmed past the checkpoint is what
// `walcount check` reports as changes that were never counted, so the
// routine updates (every status interval, on every new W and at Close)
// confirm W alone, and the servers' regular keepalives never ask for a
// reply from a client that sends those updates.
//
// ping asks the server to answer at once with a keepalive.
func (s *Stream) sendStatus(answer, ping bool) error {
	w := s.Acked()
	if answer && s.idleEnd > w && !s.inTxn && w >= s.lastCommit && s.idleEnd > s.confirmed {
		if s.cfg.ConfirmingPast == nil || s.cfg.ConfirmingPast(w, s.idleEnd) == nil {
			w = s.idleEnd
		}
	}
	w = max(w, s.confirmed)
	if w == 0 {
		// Nothing to confirm yet. A zero flush position would make
		// pglogrepl confirm the received position instead.
		return nil
	}
	s.confirmed = w
	recv := s.ReceivedLSN()
	if recv < w {
		recv = w
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: recv,
		WALFlushPosition: w,
		WALApplyPosition: w,
		ReplyRequested:   ping,
	})
	if err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	return nil
}
