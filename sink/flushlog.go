package sink

import (
	"sync"

	"github.com/walcount/walcount/cdc"
)

// FlushLog remembers what each flush applied until the stream has seen the
// flush's own transaction (its marker) and W has passed it, so that a
// flush that crossed a target row's lifecycle event can be followed (see
// package aggregator). It outlives sessions: a session that restarts
// replays from W and meets the same markers again. It is safe for
// concurrent use.
//
// Several flushes may share one upto: the pieces of a big batch, each its
// own transaction with its own marker, apply carried deltas that are all
// of the rows as they were at W (see Flusher). Their records are kept in
// commit order, which is the order in which the stream meets their
// markers.
type FlushLog struct {
	mu   sync.Mutex
	recs map[cdc.LSN][]*flushRecord
}

type flushRecord struct {
	piece  string // a piece's name (cdc.PieceMarker); "" for a flush that moves W
	deltas map[string]int64
	missed map[string]bool // fields whose UPDATE hit no row
	seenAt cdc.LSN         // where the stream saw the flush's marker; 0 until then
}

// NewFlushLog returns an empty log.
func NewFlushLog() *FlushLog { return &FlushLog{recs: map[cdc.LSN][]*flushRecord{}} }

// add records the deltas of the flush of (…, upto] before its commit, and
// the fields whose UPDATE hit no row.
func (l *FlushLog) add(upto cdc.LSN, piece string, deltas map[string]int64, missed map[string]bool) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.recs[upto] = append(l.recs[upto], &flushRecord{piece: piece, deltas: deltas, missed: missed})
	l.mu.Unlock()
}

// replace records the deltas of the flush of (…, upto] as add does, in
// place of the records of earlier attempts at the same flush whose marker
// the stream has not met (a flush tried again after a commit whose outcome
// was unknown: only one of them can have committed).
func (l *FlushLog) replace(upto cdc.LSN, deltas map[string]int64, missed map[string]bool) {
	if l == nil {
		return
	}
	l.mu.Lock()
	kept := l.recs[upto][:0]
	for _, r := range l.recs[upto] {
		if r.seenAt != 0 || r.piece != "" {
			kept = append(kept, r)
		}
	}
	l.recs[upto] = append(kept, &flushRecord{deltas: deltas, missed: missed})
	l.mu.Unlock()
}

// drop forgets the last flush added for upto, which did not commit.
func (l *FlushLog) drop(upto cdc.LSN) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if rs := l.recs[upto]; len(rs) > 0 {
		l.recs[upto] = rs[:len(rs)-1]
	}
	if len(l.recs[upto]) == 0 {
		delete(l.recs, upto)
	}
	l.mu.Unlock()
}

// Seen returns the deltas of the flush of (…, upto], whose marker the
// stream met at at, and the fields whose UPDATE hit no row; ok is false
// when they are not known (walcount restarted in between).
//
// A piece's marker names the piece: only its own record matches it, so the
// markers of another process's pieces (a walcount killed between two)
// are unknown, as they must be.
func (l *FlushLog) Seen(upto, at cdc.LSN, piece string) (deltas map[string]int64, missed map[string]bool, ok bool) {
	if l == nil {
		return nil, nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// A marker met again (a session replaying from W) finds its record
	// by where it lies; a new one takes the first record not met yet.
	var r *flushRecord
	for _, c := range l.recs[upto] {
		if c.piece == piece && c.seenAt == at {
			r = c
			break
		}
	}
	if r == nil {
		for _, c := range l.recs[upto] {
			if c.piece == piece && c.seenAt == 0 {
				r = c
				break
			}
		}
	}
	if r == nil {
		return nil, nil, false
	}
	r.seenAt = at
	return r.deltas, r.missed, true
}

// prune forgets the flushes whose marker lies at or below w: a replay
// from w never meets them again.
func (l *FlushLog) prune(w cdc.LSN) {
	if l == nil {
		return
	}
	l.mu.Lock()
	for upto, rs := range l.recs {
		kept := rs[:0]
		for _, r := range rs {
			if r.seenAt == 0 || r.seenAt > w {
				kept = append(kept, r)
			}
		}
		if len(kept) == 0 {
			delete(l.recs, upto)
		} else {
			l.recs[upto] = kept
		}
	}
	l.mu.Unlock()
}

// Len returns the number of flushes remembered.
func (l *FlushLog) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, rs := range l.recs {
		n += len(rs)
	}
	return n
}
