package cdc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/operator"
	"github.com/walcount/walcount/slot"
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
	// DefaultQueueBytes bounds the memory of the batches waiting between
	// the stream and its consumer: DefaultQueueSize batches of wide rows
	// (REPLICA IDENTITY FULL with large columns) would be no bound at all.
	DefaultQueueBytes = 64 << 20
	// DefaultBatchEvents is how many events a batch holds before it is
	// handed over even if its transaction is still open.
	DefaultBatchEvents = 4096
	// DefaultBatchBytes is how many decoded bytes (Batch.bytes) a batch
	// holds before it is handed over even if its transaction is still
	// open: 4096 events of wide rows would be gigabytes in one batch, which
	// the queue's byte budget lets through alone.
	DefaultBatchBytes = 1 << 20
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
	// DefaultSilenceTimeout is the silence bound when the server's
	// wal_sender_timeout is 0 (off) or unknown: see SilenceBound.
	DefaultSilenceTimeout = time.Minute
)

// SilenceBound returns the default StreamConfig.SilenceTimeout for a
// server whose wal_sender_timeout is walSenderTimeout: the same bound the
// walsender applies to walcount's replies, or DefaultSilenceTimeout when
// the server applies none.
func SilenceBound(walSenderTimeout time.Duration) time.Duration {
	if walSenderTimeout <= 0 {
		return DefaultSilenceTimeout
	}
	return walSenderTimeout
}

var (
	// ErrSlotInUse is wrapped when another process streams from the
	// slot: slot.ErrInUse, under the name the stream's callers know.
	ErrSlotInUse = slot.ErrInUse
	// ErrSlotMissing is wrapped when the slot does not exist:
	// slot.ErrMissing.
	ErrSlotMissing = slot.ErrMissing
	// ErrStreamSilent is wrapped when nothing, not even a keepalive,
	// arrived for longer than StreamConfig.SilenceTimeout: the server, or
	// the network path to it, is gone while the socket stays open.
	ErrStreamSilent = errors.New("replication stream went silent")
	// ErrPublicationMissing is wrapped when the walsender finds no
	// publication for a change it decodes: the publication was dropped,
	// or the slot's position predates it (pgoutput reads the catalog as
	// of the decoded change). Every retry decodes the same change, so it
	// needs an operator.
	ErrPublicationMissing = operator.NewError("the replication slot sees no publication")
)

// streamError classifies an error the walsender sent during streaming.
func streamError(slot, pub string, err *pgconn.PgError) error {
	if err.Code == "42704" && strings.Contains(err.Message, "publication") { // undefined_object
		return fmt.Errorf("replication stream: %w %q at the change it decodes (%s, SQLSTATE %s): "+
			"the publication was dropped, or replication slot %q was made before it and decodes changes from before it; "+
			"stop walcount, run walcount check, then walcount setup (it creates the publication, and drops and recreates a slot older than it; walcount run then repairs every counter)",
			ErrPublicationMissing, pub, err.Message, err.Code, slot)
	}
	return fmt.Errorf("replication stream: %w", err)
}

// StreamConfig configures a Stream.
type StreamConfig struct {
	// ConnString is the PostgreSQL URL; replication=database is added.
	ConnString string
	// Slot and Publication name the logical slot and the publication.
	Slot        string
	Publication string
	// StartLSN is where streaming starts: W, the checkpoint.
	StartLSN LSN
	// AckLater makes the stream confirm nothing until the first Ack,
	// instead of StartLSN at once: the daemon passes W through its
	// standby gate first (see sink.StandbyGate).
	AckLater bool
	// StatusInterval: default DefaultStatusInterval.
	StatusInterval time.Duration
	// ReceiveTimeout: default DefaultReceiveTimeout.
	ReceiveTimeout time.Duration
	// SilenceTimeout, when more than 0, bounds the time the stream waits
	// for any message: past it Run fails with ErrStreamSilent. A healthy
	// walsender always answers in time, because while nothing arrives the
	// stream's status updates ask for a reply (a keepalive) every third of
	// the bound, or every StatusInterval when that is sooner.
	SilenceTimeout time.Duration
	// QueueSize, in batches: default DefaultQueueSize.
	QueueSize int
	// QueueBytes bounds the bytes of the batches handed over and not yet
	// released; a single batch larger than the bound still goes alone.
	// Default DefaultQueueBytes.
	QueueBytes int64
	// BatchEvents: default DefaultBatchEvents.
	BatchEvents int
	// BatchBytes: default DefaultBatchBytes. A batch is handed over once
	// it holds this much, so it exceeds it by at most one message's rows.
	BatchBytes int64
	// CoalesceWindow: while data streams in, the stream sets the TCP
	// socket's SO_RCVLOWAT and wakes when 64 KiB are queued or this
	// window ends, instead of once per message. The walsender sends
	// every pgoutput message with its own send(), so at thousands of
	// transactions per second waking per message costs walcount and the
	// walsender more CPU than decoding and counting (docs/benchmarks.md
	// has the measurements). The cost is up to one window of added
	// latency. Default
	// DefaultCoalesceWindow; negative reads every message as it arrives.
	CoalesceWindow time.Duration
	// Observer receives progress callbacks; nil ignores them.
	Observer Observer
	// ConfirmingPast, when set, is called before the stream confirms a
	// position past W (see sendStatus: only to let PostgreSQL shut down
	// while nothing is in flight). It must record that durably enough
	// for the next start to tell this benign confirmation from a slot
	// advanced by hand; an error keeps the stream at W. It runs on the
	// receive loop: it must be quick.
	ConfirmingPast func(w, to LSN) error
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
	// consumerGone, when set (ConsumerGone), closes once the consumer of
	// Batches stopped taking them: a stopping Run then does not wait for
	// it.
	consumerGone <-chan struct{}
	// history is "<system identifier>/<timeline>" of the server.
	history string
	// msgRel is the OID of walcount's table of messages, 0 when it does
	// not exist: then no message is trusted.
	msgRel uint32
	out    chan *Batch
	pool   sync.Pool

	ack  atomic.Uint64 // W: the position to confirm
	recv atomic.Uint64 // highest WAL position received

	// queued is the bytes of the batches handed over and not yet
	// released; released is signalled by Release for a blocked handOver.
	queued   atomic.Int64
	released chan struct{}

	// Owned by Run (and by Close after Run returned).
	inTxn      bool // a BEGIN was decoded without its COMMIT
	lastCommit LSN  // end LSN of the last COMMIT decoded
	idleEnd    LSN  // the server's sent position from a keepalive no data followed
	confirmed  LSN  // the highest flush position sent
	// dead is set when Run declared the stream silent: Close then
	// closes the socket without waiting for a server that does not
	// answer.
	dead bool
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
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.BatchEvents <= 0 {
		cfg.BatchEvents = DefaultBatchEvents
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = DefaultBatchBytes
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
	// A statement_timeout or lock_timeout of the database or the role
	// must not cut the replication commands short.
	pcfg.RuntimeParams["statement_timeout"] = "0"
	pcfg.RuntimeParams["lock_timeout"] = "0"
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect for replication: %w", poolerError(err))
	}
	// The server's system identifier and timeline name the history the
	// stream belongs to; after a failover or a restore the same LSNs may
	// hold other transactions (design rule 13).
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("identify system: %w", err)
	}
	msgRel, err := messageRelation(ctx, conn)
	if err != nil {
		conn.Close(context.Background())
		return nil, err
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
		cfg:     cfg,
		log:     cfg.Logger,
		conn:    conn,
		history: fmt.Sprintf("%s/%d", sys.SystemID, sys.Timeline),
		msgRel:  msgRel,
		out:     make(chan *Batch, cfg.QueueSize),

		released: make(chan struct{}, 1),
	}
	if !cfg.AckLater {
		s.ack.Store(uint64(cfg.StartLSN))
	}
	s.recv.Store(uint64(cfg.StartLSN))
	return s, nil
}

// messageRelation reads the OID of walcount's table of messages on the
// replication connection, 0 when the table does not exist.
func messageRelation(ctx context.Context, conn *pgconn.PgConn) (uint32, error) {
	res, err := conn.Exec(ctx, "SELECT coalesce(to_regclass("+quoteLiteral(MessageTable)+")::oid, 0)").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("look up %s: %w", MessageTable, err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, fmt.Errorf("look up %s: unexpected result", MessageTable)
	}
	oid, err := strconv.ParseUint(string(res[0].Rows[0][0]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("look up %s: %w", MessageTable, err)
	}
	return uint32(oid), nil
}

// newDecoder returns a decoder for one session of the stream.
func (s *Stream) newDecoder() *Decoder {
	d := NewDecoder()
	d.TrustMessages(s.msgRel)
	return d
}

// BackendPID returns the process id of the walsender that serves the
// stream.
func (s *Stream) BackendPID() uint32 { return s.conn.PID() }

// History returns "<system identifier>/<timeline>": the server history
// the stream reads, from IDENTIFY_SYSTEM. A promoted standby keeps the
// system identifier and starts a new timeline; a restored backup or
// another cluster has another identifier.
func (s *Stream) History() string { return s.history }

// Batches is the stream's output. It is closed when Run returns.
func (s *Stream) Batches() <-chan *Batch { return s.out }

// ConsumerGone tells Run that done closes when the consumer of Batches
// stops: a Run stopping after it (the consumer failed) hands nothing over
// and returns at once. Call it before Run.
func (s *Stream) ConsumerGone(done <-chan struct{}) { s.consumerGone = done }

// Release hands a consumed batch back for reuse and frees its bytes in
// the queue's budget. The caller must not use the batch or any tuple in it
// afterwards.
func (s *Stream) Release(b *Batch) {
	s.queued.Add(-b.charged)
	select {
	case s.released <- struct{}{}:
	default:
	}
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

// QueueBytes returns the bytes of the batches handed over and not yet
// released.
func (s *Stream) QueueBytes() int64 { return s.queued.Load() }

// admit charges n bytes to the queue's budget if they fit, or if nothing
// is queued: one batch larger than the budget must still go.
func (s *Stream) admit(n int64) bool {
	for {
		cur := s.queued.Load()
		if cur > 0 && cur+n > s.cfg.QueueBytes {
			return false
		}
		if s.queued.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Close sends a last status update confirming W, so that an Ack made
// after Run returned (the final flush of a clean shutdown) reaches the
// server, then closes the connection. Call it after Run has returned.
func (s *Stream) Close() {
	if !s.conn.IsClosed() && !s.dead {
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
	if err := s.sendStatus(false, false); err != nil {
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
	r := s.newReceiver(ctx)
	defer r.close()
	for {
		if ctx.Err() != nil {
			return r.stop()
		}
		if err := r.statusIfDue(); err != nil {
			return err
		}
		if err := r.setDeadline(); err != nil {
			return err
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				continue // the loop head stops
			}
			if !pgconn.Timeout(err) {
				return fmt.Errorf("receive replication message: %w", err)
			}
			if err := r.quiet(); err != nil {
				return err
			}
			continue
		}
		r.heard = time.Now()
		if err := r.dispatch(msg); err != nil {
			return err
		}
	}
}
