package cdc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// Defaults of StreamConfig.
const (
	// DefaultStatusInterval is how often a standby status update is sent
	// when nothing else prompts one. It must stay well below the server's
	// wal_sender_timeout (default 60s).
	DefaultStatusInterval = 10 * time.Second
	// DefaultReceiveTimeout bounds every receive, so acks and status
	// updates go out on time even when the server is silent.
	DefaultReceiveTimeout = 500 * time.Millisecond
	// DefaultQueueSize is the capacity, in batches, of the channel between
	// the stream and its consumer.
	DefaultQueueSize = 64
	// DefaultBatchEvents is how many events a batch holds before it is
	// handed over even if its transaction is still open.
	DefaultBatchEvents = 4096
	// handOverLinger is how long a batch ending in a COMMIT waits for
	// more messages before it is handed over, when the stream cannot
	// coalesce reads.
	handOverLinger = time.Millisecond
	// DefaultCoalesceWindow is how long the stream lets WAL data gather
	// in the socket while it streams in: see StreamConfig.CoalesceWindow.
	DefaultCoalesceWindow = 5 * time.Millisecond
	// coalesceLowWater is the SO_RCVLOWAT used while coalescing: the
	// reader wakes when this much is queued or the window ends.
	coalesceLowWater = 64 << 10
)

var (
	// ErrSlotInUse is wrapped when another process streams from the slot.
	ErrSlotInUse = errors.New("replication slot is in use by another process")
	// ErrSlotMissing is wrapped when the slot does not exist.
	ErrSlotMissing = errors.New("replication slot does not exist")
)

// StreamConfig configures a Stream.
type StreamConfig struct {
	// ConnString is the PostgreSQL URL; replication=database is added.
	ConnString string
	// Slot and Publication name the logical slot and the publication.
	Slot        string
	Publication string
	// StartLSN is where streaming starts: W, the checkpoint.
	StartLSN LSN
	// StatusInterval: default DefaultStatusInterval.
	StatusInterval time.Duration
	// ReceiveTimeout: default DefaultReceiveTimeout.
	ReceiveTimeout time.Duration
	// QueueSize, in batches: default DefaultQueueSize.
	QueueSize int
	// BatchEvents: default DefaultBatchEvents.
	BatchEvents int
	// CoalesceWindow: while data streams in, the stream sets the TCP
	// socket's SO_RCVLOWAT and wakes when 64 KiB are queued or this
	// window ends, instead of once per message. The walsender sends
	// every pgoutput message with its own send(), so at thousands of
	// transactions per second waking per message cost walcount and the
	// walsender more CPU than decoding and counting (issue 5). The cost
	// is up to one window of added latency. Default
	// DefaultCoalesceWindow; negative reads every message as it arrives.
	CoalesceWindow time.Duration
	// Observer receives progress callbacks; nil ignores them.
	Observer Observer
	// Logger: nil means no logging.
	Logger *zap.Logger
}

// Observer is told what the stream does; metrics implement it. Its
// methods are called from the stream's goroutine and must not block.
type Observer interface {
	// Received is called with the end of every WAL data message.
	Received(lsn LSN)
	// Blocked is called when handing a batch over had to wait.
	Blocked(d time.Duration)
}

// Stream owns one replication connection. Run is its only user; Ack may
// be called from any goroutine.
type Stream struct {
	cfg  StreamConfig
	log  *zap.Logger
	conn *pgconn.PgConn
	out  chan *Batch
	pool sync.Pool

	ack  atomic.Uint64 // W: the position to confirm
	recv atomic.Uint64 // highest WAL position received

	// Owned by Run (and by Close after Run returned).
	inTxn      bool // a BEGIN was decoded without its COMMIT
	lastCommit LSN  // end LSN of the last COMMIT decoded
	idleEnd    LSN  // the server's sent position from a keepalive no data followed
	confirmed  LSN  // the highest flush position sent
}

// Connect opens a replication connection and starts streaming from
// cfg.StartLSN. When another process holds the slot it fails with an
// error wrapping ErrSlotInUse, so a standby instance can wait and retry.
func Connect(ctx context.Context, cfg StreamConfig) (*Stream, error) {
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.ReceiveTimeout <= 0 {
		cfg.ReceiveTimeout = DefaultReceiveTimeout
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.BatchEvents <= 0 {
		cfg.BatchEvents = DefaultBatchEvents
	}
	if cfg.CoalesceWindow == 0 {
		cfg.CoalesceWindow = DefaultCoalesceWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	pcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	pcfg.RuntimeParams["replication"] = "database"
	pcfg.RuntimeParams["application_name"] = "walcount"
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect for replication: %w", err)
	}
	args := []string{
		"proto_version '1'",
		"publication_names " + quoteLiteral(cfg.Publication),
		"messages 'true'",
	}
	err = pglogrepl.StartReplication(ctx, conn, quoteIdent(cfg.Slot), cfg.StartLSN,
		pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: args})
	if err != nil {
		conn.Close(context.Background())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case "55006": // object_in_use
				return nil, fmt.Errorf("start replication on slot %q: %w: %s", cfg.Slot, ErrSlotInUse, pgErr.Message)
			case "42704": // undefined_object
				return nil, fmt.Errorf("start replication on slot %q: %w (run walcount setup): %s", cfg.Slot, ErrSlotMissing, pgErr.Message)
			}
		}
		return nil, fmt.Errorf("start replication on slot %q: %w", cfg.Slot, err)
	}
	s := &Stream{
		cfg:  cfg,
		log:  cfg.Logger,
		conn: conn,
		out:  make(chan *Batch, cfg.QueueSize),
	}
	s.ack.Store(uint64(cfg.StartLSN))
	s.recv.Store(uint64(cfg.StartLSN))
	return s, nil
}

// Batches is the stream's output. It is closed when Run returns.
func (s *Stream) Batches() <-chan *Batch { return s.out }

// Release hands a consumed batch back for reuse. The caller must not use
// the batch or any tuple in it afterwards.
func (s *Stream) Release(b *Batch) {
	b.reset()
	s.pool.Put(b)
}

// Ack records W, the end LSN of the last transaction whose deltas are
// committed to the counter columns. It never moves backwards. The next
// status update carries it; Ack does not touch the connection.
func (s *Stream) Ack(lsn LSN) {
	for {
		cur := s.ack.Load()
		if uint64(lsn) <= cur {
			return
		}
		if s.ack.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// Acked returns the position the next status update confirms.
func (s *Stream) Acked() LSN { return LSN(s.ack.Load()) }

// ReceivedLSN returns the highest WAL position received so far.
func (s *Stream) ReceivedLSN() LSN { return LSN(s.recv.Load()) }

// QueueDepth returns how many batches wait for the consumer.
func (s *Stream) QueueDepth() int { return len(s.out) }

// Close sends a last status update confirming W, so that an Ack made
// after Run returned (the final flush of a clean shutdown) reaches the
// server, then closes the connection. Call it after Run has returned.
func (s *Stream) Close() {
	if !s.conn.IsClosed() {
		if err := s.confirmFinal(); err != nil {
			s.log.Warn("final status update not confirmed; the slot may confirm an older W (harmless: it is replayed and skipped)", zap.Error(err))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.conn.Close(ctx)
}

// confirmFinal sends the last status update, then ends the COPY BOTH
// mode with CopyDone and reads until the server is back at
// ReadyForQuery. The server handles messages in order, so by then it has
// recorded W. Simply closing the socket while the server still streams
// could lose the update: closing with unread data makes the kernel send
// a reset, and the server discards what it had not read yet.
func (s *Stream) confirmFinal() error {
	if err := s.sendStatus(false); err != nil {
		return err
	}
	s.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := s.conn.Frontend().Flush(); err != nil {
		return fmt.Errorf("send CopyDone: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		msg, err := s.conn.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("end the replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		}
	}
}

func (s *Stream) newBatch() *Batch {
	if b, ok := s.pool.Get().(*Batch); ok {
		return b
	}
	return &Batch{Events: make([]Event, 0, 256)}
}

// Run receives, decodes and hands over events until ctx is done or the
// connection fails. It sends a final status update confirming W on the
// way out when the connection still works.
func (s *Stream) Run(ctx context.Context) error {
	defer close(s.out)
	dec := NewDecoder()
	batch := s.newBatch()
	sentAck := LSN(0)
	nextStatus := time.Now()
	// Receives use the socket's read deadline, not a context per
	// message: a context costs an allocation and a watcher goroutine
	// hand-off per message, which was a fifth of walcount's CPU. A
	// cancelled ctx expires the deadline at once; a timeout leaves the
	// connection usable and a partly read message resumes.
	nc := s.conn.Conn()
	stopWatch := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Now()) })
	defer stopWatch()
	defer func() { _ = nc.SetReadDeadline(time.Time{}) }()
	// Coalescing (see StreamConfig.CoalesceWindow): it starts with the
	// first WAL data after a quiet spell and ends after a window in which
	// nothing arrived, so an idle stream sleeps until the next message.
	canCoalesce := s.cfg.CoalesceWindow > 0 && setReceiveLowWater(nc, 1)
	coalescing := false
	var windowEnd time.Time // while coalescing: when the current window ends
	windowMsgs := 0         // messages received in the current window
	setCoalescing := func(on bool) {
		lowat := 1
		if on {
			lowat = coalesceLowWater
		}
		if !setReceiveLowWater(nc, lowat) {
			canCoalesce, on = false, false
		}
		coalescing = on
	}
	defer func() {
		if coalescing {
			setCoalescing(false) // Close reads the end of the stream
		}
	}()
	var deadline time.Time
	for {
		if ctx.Err() != nil {
			// What was received goes to the consumer, which drains the
			// queue on a clean stop, so a shutdown flushes it. A full
			// queue means a consumer far behind: the rest is replayed
			// from W at the next start.
			if len(batch.Events) > 0 {
				select {
				case s.out <- batch:
				default:
				}
			}
			_ = s.sendStatus(false)
			return nil
		}
		now := time.Now()
		if acked := s.Acked(); acked != sentAck || !now.Before(nextStatus) {
			if err := s.sendStatus(false); err != nil {
				return err
			}
			sentAck = acked
			nextStatus = now.Add(s.cfg.StatusInterval)
		}
		want := now.Add(s.cfg.ReceiveTimeout)
		if nextStatus.Before(want) {
			want = nextStatus
		}
		if coalescing {
			if windowEnd.Before(want) {
				want = windowEnd
			}
		} else if n := len(batch.Events); n > 0 && batch.Events[n-1].Kind == KindCommit {
			// A finished transaction waits at most a millisecond for
			// more to join its batch: under load batches fill up, a
			// lone transaction goes on at once.
			want = now.Add(handOverLinger)
		}
		// Setting a deadline is cheap but not free: keep one until it
		// passes or a nearer one is wanted.
		if !now.Before(deadline) || want.Before(deadline) {
			deadline = want
			if err := nc.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("set receive deadline: %w", err)
			}
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				continue // the loop head sends the final update
			}
			if pgconn.Timeout(err) {
				// Nothing (more) arrived in time: hand over what is
				// decoded so the consumer is not starved by a half-full
				// batch.
				if len(batch.Events) > 0 {
					if batch, err = s.handOver(ctx, batch); err != nil {
						return err
					}
				}
				if coalescing {
					if now := time.Now(); !now.Before(windowEnd) {
						// Every read tries the socket before it waits,
						// so a window without messages was a quiet one.
						if windowMsgs == 0 {
							setCoalescing(false)
						}
						windowMsgs = 0
						windowEnd = now.Add(s.cfg.CoalesceWindow)
					}
				}
				continue
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		if coalescing {
			windowMsgs++
		} else if canCoalesce {
			setCoalescing(true)
			windowMsgs, windowEnd = 0, time.Now().Add(s.cfg.CoalesceWindow)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				s.idleEnd = ka.ServerWALEnd
				if ka.ReplyRequested {
					if err := s.sendStatus(true); err != nil {
						return err
					}
					sentAck = s.Acked()
					nextStatus = time.Now().Add(s.cfg.StatusInterval)
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse xlogdata: %w", err)
				}
				before := len(batch.Events)
				if err := dec.Decode(xld.WALData, batch); err != nil {
					return fmt.Errorf("decode wal at %s: %w", xld.WALStart, err)
				}
				s.idleEnd = 0
				if n := len(batch.Events); n > before {
					switch ev := &batch.Events[n-1]; ev.Kind {
					case KindBegin:
						s.inTxn = true
					case KindCommit:
						s.inTxn, s.lastCommit = false, ev.LSN
					}
				}
				end := xld.WALStart + LSN(len(xld.WALData))
				if uint64(end) > s.recv.Load() {
					s.recv.Store(uint64(end))
				}
				if s.cfg.Observer != nil {
					s.cfg.Observer.Received(end)
				}
				if len(batch.Events) >= s.cfg.BatchEvents {
					if batch, err = s.handOver(ctx, batch); err != nil {
						return err
					}
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("replication stream: server ended the stream")
		}
	}
}

// handOver sends b downstream and returns a fresh batch. While the
// consumer is slow it blocks (backpressure), but keeps sending status
// updates so the server does not time the connection out, and logs the
// stall once.
func (s *Stream) handOver(ctx context.Context, b *Batch) (*Batch, error) {
	select {
	case s.out <- b:
		return s.newBatch(), nil
	default:
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
		select {
		case s.out <- b:
			return s.newBatch(), nil
		case <-ctx.Done():
			return b, nil // Run notices ctx and stops
		case <-tick.C:
			if !logged {
				s.log.Warn("consumer is slow; replication reading is paused (backpressure)",
					zap.Duration("blocked_for", time.Since(start)), zap.Int("queue", cap(s.out)))
				logged = true
			}
			if err := s.sendStatus(false); err != nil {
				return b, err
			}
		}
	}
}

// sendStatus sends a standby status update. Write is the received
// position; flush and apply are W, set explicitly because pglogrepl copies
// the write position into a zero flush field (DESIGN §2 rule 3).
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
func (s *Stream) sendStatus(answer bool) error {
	w := s.Acked()
	if answer && s.idleEnd > w && !s.inTxn && w >= s.lastCommit {
		w = s.idleEnd
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
	})
	if err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	return nil
}
