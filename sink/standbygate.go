package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/slot"
)

// Defaults of StandbyGate.
const (
	// DefaultGatePoll is how often the gate reads the standbys' position
	// while a W waits for them.
	DefaultGatePoll = 100 * time.Millisecond
	// DefaultGateRefresh is how often the gate rereads
	// synchronized_standby_slots.
	DefaultGateRefresh = 10 * time.Second
)

// GateQuerier reads; *pgxpool.Pool fits.
type GateQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// StandbyGate holds W back from the slot until the flush transaction that
// wrote it is on every standby that can carry the slot (design rule 16).
//
// W lives in the same database as the counters. After a failover the new
// primary holds the W of its copy, which may be older; if its copy of the
// slot (synchronised from PostgreSQL 17 on) had been confirmed past that W,
// the server would skip the changes in between, and their deltas would be
// lost for good. So a new W is confirmed only once every physical slot
// named in synchronized_standby_slots has flushed the WAL past the flush's
// commit; until then the previous W is confirmed. A standby that lags makes
// the slot's lag grow, visibly, never the counts wrong. Without
// synchronized_standby_slots (or before PostgreSQL 17) W passes at once.
type StandbyGate struct {
	q   GateQuerier
	ack AckFunc
	log *zap.Logger
	// Poll and Refresh: defaults DefaultGatePoll and DefaultGateRefresh.
	Poll, Refresh time.Duration

	// replica is the hot standby that holds the slot and decodes, nil
	// when the slot is on the primary (see WaitReplay).
	replica GateQuerier

	mu        sync.Mutex
	slots     []string
	slotsRead time.Time
	pending   []gated // in W order
	latest    cdc.LSN // the last W committed
	released  cdc.LSN // the last W confirmed
	kick      chan struct{}
}

// gated is a W waiting for the standbys to pass c, its flush's commit.
type gated struct{ w, c cdc.LSN }

// NewStandbyGate returns a gate that passes W to ack.
func NewStandbyGate(q GateQuerier, ack AckFunc, log *zap.Logger) *StandbyGate {
	if log == nil {
		log = zap.NewNop()
	}
	return &StandbyGate{q: q, ack: ack, log: log, Poll: DefaultGatePoll, Refresh: DefaultGateRefresh, kick: make(chan struct{}, 1)}
}

// ErrPromoted means the hot standby that holds the slot is a primary now:
// the session ends, and the next one finds the slot on a primary.
var ErrPromoted = errors.New("the standby that holds the slot was promoted")

// WaitReplay makes the gate also hold every W back until the hot standby
// that holds the slot (decoding on a standby, PostgreSQL 16 and later) has
// received the flush transaction that wrote it (pg_last_wal_receive_lsn:
// flushed to its disk, replayed at the latest by a promotion). A slot confirmed past the W
// its own server holds would, after a promotion of that standby, skip the
// changes in between for good: the checkpoint there would still be the
// earlier W. Call it before the first Committed. Run returns ErrPromoted
// once the standby is no longer in recovery.
func (g *StandbyGate) WaitReplay(replica GateQuerier) { g.replica = replica }

// Committed is the flusher's AckFunc: W committed. It passes W on at once
// when no standby must carry the slot, and queues it otherwise.
func (g *StandbyGate) Committed(w cdc.LSN) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slots, err := g.standbySlots(ctx)
	if err == nil && len(slots) == 0 && g.replica == nil {
		g.pass(w)
		return
	}
	// The commit ends before the insert position read after it. When it
	// cannot be read, W waits for the next flush, which carries a later
	// W and reads again.
	var c cdc.LSN
	if err == nil {
		err = g.q.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&c)
	}
	g.mu.Lock()
	g.latest = max(g.latest, w)
	if err == nil {
		g.pending = append(g.pending, gated{w: w, c: c})
	}
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// pass confirms w and everything queued below it.
func (g *StandbyGate) pass(w cdc.LSN) {
	g.mu.Lock()
	g.latest = max(g.latest, w)
	g.released = max(g.released, w)
	i := 0
	for i < len(g.pending) && g.pending[i].w <= w {
		i++
	}
	g.pending = g.pending[i:]
	g.mu.Unlock()
	g.ack(w)
}

// Held returns how far the confirmed W is behind the committed one, in
// bytes of WAL: what waits for the standbys.
func (g *StandbyGate) Held() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.latest <= g.released {
		return 0
	}
	return int64(g.latest - g.released)
}

// Slots returns the physical slots the gate waits for.
func (g *StandbyGate) Slots() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.slots...)
}

// standbySlots returns synchronized_standby_slots, reread every Refresh.
func (g *StandbyGate) standbySlots(ctx context.Context) ([]string, error) {
	g.mu.Lock()
	if !g.slotsRead.IsZero() && time.Since(g.slotsRead) < g.Refresh {
		s := g.slots
		g.mu.Unlock()
		return s, nil
	}
	g.mu.Unlock()
	slots, _, err := slot.StandbySlots(ctx, g.q)
	if err != nil {
		return nil, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	g.mu.Lock()
	g.slots, g.slotsRead = slots, time.Now()
	g.mu.Unlock()
	return slots, nil
}

// replayed reads how far the standby that holds the slot has received
// and flushed the primary's WAL: a promotion replays all of it before the
// standby opens, so a flush it has is a flush the promoted standby has.
func (g *StandbyGate) replayed(ctx context.Context) (cdc.LSN, error) {
	recovery, lsn, err := slot.Received(ctx, g.replica)
	if err != nil {
		return 0, err
	}
	if !recovery {
		return 0, ErrPromoted
	}
	if lsn == nil {
		return 0, errors.New("the standby has received nothing yet")
	}
	return *lsn, nil
}

// shuttingDown reports whether err is the refusal of a server that shuts
// down (SQLSTATE 57P03, "the database system is shutting down").
func shuttingDown(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P03" && strings.Contains(pgErr.Message, "shutting down")
}

// Run releases the queued Ws as the standbys pass them, until ctx is
// done. A slot named in synchronized_standby_slots that does not exist
// never passes: PostgreSQL itself waits for it too.
func (g *StandbyGate) Run(ctx context.Context) error {
	t := time.NewTicker(g.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-g.kick:
		case <-t.C:
		}
		g.mu.Lock()
		waiting := len(g.pending) > 0
		g.mu.Unlock()
		if !waiting {
			continue
		}
		slots, err := g.standbySlots(ctx)
		if err != nil {
			continue
		}
		if len(slots) == 0 && g.replica == nil {
			// The setting was cleared: nothing to wait for.
			g.mu.Lock()
			w := g.latest
			g.mu.Unlock()
			g.pass(w)
			continue
		}
		var flushed *cdc.LSN
		if len(slots) > 0 {
			flushed, err = slot.StandbysFlushed(ctx, g.q, slots)
			if err != nil || flushed == nil {
				continue
			}
		}
		if g.replica != nil {
			replayed, err := g.replayed(ctx)
			if err != nil {
				if errors.Is(err, ErrPromoted) {
					return err
				}
				if shuttingDown(err) {
					// Its shutdown waits until walcount confirmed all
					// it was sent, and it receives no more WAL: the
					// flushes it lacks it gets after its restart.
					g.mu.Lock()
					w := g.latest
					g.mu.Unlock()
					g.pass(w)
				}
				continue
			}
			if flushed == nil || replayed < *flushed {
				flushed = &replayed
			}
		}
		g.mu.Lock()
		var w cdc.LSN
		for _, p := range g.pending {
			if p.c > *flushed {
				break
			}
			w = p.w
		}
		g.mu.Unlock()
		if w != 0 {
			g.pass(w)
		}
	}
}
