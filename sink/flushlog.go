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
type FlushLog struct {
	mu   sync.Mutex
	recs map[cdc.LSN]*flushRecord
}

type flushRecord struct {
	deltas map[string]int64
	missed map[string]bool // fields whose UPDATE hit no row
	seenAt cdc.LSN         // where the stream saw the flush's marker; 0 until then
}

// NewFlushLog returns an empty log.
func NewFlushLog() *FlushLog { return &FlushLog{recs: map[cdc.LSN]*flushRecord{}} }

// add records the deltas of the flush of (…, upto] before its commit, and
// the fields whose UPDATE hit no row.
func (l *FlushLog) add(upto cdc.LSN, deltas map[string]int64, missed map[string]bool) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.recs[upto] = &flushRecord{deltas: deltas, missed: missed}
	l.mu.Unlock()
}

// drop forgets a flush that did not commit.
func (l *FlushLog) drop(upto cdc.LSN) {
	if l == nil {
		return
	}
	l.mu.Lock()
	delete(l.recs, upto)
	l.mu.Unlock()
}

// Seen returns the deltas of the flush of (…, upto], whose marker the
// stream met at at, and the fields whose UPDATE hit no row; ok is false
// when they are not known (walcount restarted in between).
func (l *FlushLog) Seen(upto, at cdc.LSN) (deltas map[string]int64, missed map[string]bool, ok bool) {
	if l == nil {
		return nil, nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.recs[upto]
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
	for upto, r := range l.recs {
		if r.seenAt != 0 && r.seenAt <= w {
			delete(l.recs, upto)
		}
	}
	l.mu.Unlock()
}

// Len returns the number of flushes remembered.
func (l *FlushLog) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recs)
}
