package reconcile

import (
	"bytes"
	"encoding/json"
	"errors"
	"iter"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
)

// errSessionRestarted means the replication session a measurement relied
// on ended; the measurement is repeated.
var errSessionRestarted = errors.New("replication session restarted during the measurement")

// marker is the content of walcount's reconcile messages.
type marker struct {
	Reconcile string `json:"reconcile"`
	Phase     int    `json:"phase"`
	Slot      string `json:"slot"`
}

// correction is the content of the message that carries a measurement's
// corrections through the WAL (docs/design.md §5, step 6): it reaches the stream
// as an ordinary transaction, so the corrections are applied exactly once
// with the deltas around them, even when walcount crashes before the flush
// and the stream is replayed.
type correction struct {
	Correct map[string]int64 `json:"correct"`
	Slot    string           `json:"slot"`
}

var correctTag = []byte(`"correct"`)

// txnRecord is one recorded transaction: its deltas for the measured
// counter.
type txnRecord struct {
	xid    uint32
	end    cdc.LSN
	deltas map[string]int64 // key → delta
}

// MaxRecordedDeltas bounds what one measurement records: a measurement
// that would record more (a write load far above what the flushes keep
// up with) fails with errTooManyChanges and is repeated over fewer keys.
const MaxRecordedDeltas = 1 << 20

// errTooManyChanges means a measurement recorded MaxRecordedDeltas.
var errTooManyChanges = errors.New("too many changes of the counter during the measurement")

// measurement is one bracketed measurement. It records the deltas of every
// transaction of its counter, whatever the key, from M0's commit to M1, so
// that one snapshot serves any number of keys: a whole range of them and
// the keys measured again, read in the same snapshot.
type measurement struct {
	id      string
	counter string
	gen     uint64

	// Stream side, under Recorder.mu.
	m0Xid     uint32
	m0Seen    bool
	m0End     cdc.LSN
	recording bool
	invalid   error
	records   []txnRecord
	recorded  int             // deltas in records
	moved     map[string]bool // keys whose buffered deltas a target lifecycle event moved
	committed chan struct{}   // closed when M0's transaction committed

	// Reconciler side, set before M1 is emitted.
	ready bool
	snap  Snapshot
	ws    cdc.LSN

	done chan struct{} // closed at M1 or on failure
	// At M1: pending(k), non-zero only, and the moved keys.
	pending map[string]int64
	err     error
}

// Recorder is the part of reconciliation that runs inside the stream, the
// aggregator's Reconciliation: the aggregator calls HandleMessage and
// Observe from its goroutine, in stream order. The reconciler registers measurements from another
// goroutine. All methods are safe for concurrent use.
type Recorder struct {
	slot   string
	log    *zap.Logger
	active atomic.Int32

	mu   sync.Mutex
	gen  uint64
	byID map[string]*measurement
}

// NewRecorder returns a Recorder for slot's markers.
func NewRecorder(slot string, log *zap.Logger) *Recorder {
	if log == nil {
		log = zap.NewNop()
	}
	return &Recorder{slot: slot, log: log, byID: map[string]*measurement{}}
}

// NewSession forgets everything recorded: a new replication session
// cannot continue a measurement, because transactions it skips as
// already applied would not be recorded. Open measurements fail and are
// repeated by the reconciler.
func (r *Recorder) NewSession() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	for id, m := range r.byID {
		r.finishLocked(m, errSessionRestarted)
		delete(r.byID, id)
	}
}

// register adds a measurement; it starts recording at M0's commit.
func (r *Recorder) register(m *measurement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m.gen = r.gen
	m.committed = make(chan struct{})
	m.done = make(chan struct{})
	m.moved = map[string]bool{}
	r.byID[m.id] = m
	r.active.Add(1)
}

// unregister removes m, whatever its state.
func (r *Recorder) unregister(m *measurement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finishLocked(m, errors.New("measurement abandoned"))
	delete(r.byID, m.id)
}

// finishLocked ends m once: it stops recording and wakes the waiter.
func (r *Recorder) finishLocked(m *measurement, err error) {
	select {
	case <-m.done:
		return
	default:
	}
	m.err = err
	m.recording = false
	r.active.Add(-1)
	close(m.done)
}

// setSnapshot stores the snapshot the reads were made in and W as it saw
// it; it must happen before M1 is emitted.
func (r *Recorder) setSnapshot(m *measurement, snap Snapshot, ws cdc.LSN) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m.snap, m.ws, m.ready = snap, ws, true
}

var reconcileTag = []byte(`"reconcile"`)

// HandleMessage receives walcount's messages from the aggregator. At a
// measurement's M1 it computes pending(k) (the reconciler then computes
// the corrections and emits those to apply); at a correction message it
// returns the corrections, as deltas of the message's transaction.
func (r *Recorder) HandleMessage(_ cdc.LSN, xid uint32, content []byte) ([]counter.Delta, error) {
	if bytes.Contains(content, correctTag) {
		var c correction
		if err := json.Unmarshal(content, &c); err != nil || c.Slot != r.slot {
			return nil, nil // not ours
		}
		deltas := make([]counter.Delta, 0, len(c.Correct))
		for f, n := range c.Correct {
			deltas = append(deltas, counter.Delta{Field: f, N: n})
		}
		return deltas, nil
	}
	if !bytes.Contains(content, reconcileTag) {
		return nil, nil // a heartbeat
	}
	var mk marker
	if err := json.Unmarshal(content, &mk); err != nil || mk.Slot != r.slot {
		return nil, nil // not ours: another walcount on this database
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byID[mk.Reconcile]
	if m == nil || m.gen != r.gen {
		// A marker of a measurement that no longer exists, resent after a
		// restart: its corrections, if any, are not repeated.
		return nil, nil
	}
	switch mk.Phase {
	case 0:
		m.m0Xid, m.m0Seen = xid, true
		return nil, nil
	case 1:
		if !m.ready || !m.recording {
			r.finishLocked(m, errors.New("marker M1 arrived before the measurement was ready"))
			return nil, nil
		}
		if m.invalid != nil {
			r.finishLocked(m, m.invalid)
			return nil, nil
		}
		// The corrections do not enter the stream here: they would be
		// lost with this session if walcount crashed before the flush.
		// The reconciler computes them from pending and emits them in a
		// message of their own.
		m.pending = m.pendingDeltas()
		r.finishLocked(m, nil)
		return nil, nil
	}
	return nil, nil
}

// pendingDeltas returns pending(k) for every key with recorded deltas:
// the sum of the deltas of transactions that end after W_S (not in the
// column as S sees it) and that S sees as committed (in the truth). Keys
// whose sum is zero are left out.
func (m *measurement) pendingDeltas() map[string]int64 {
	pending := map[string]int64{}
	for _, rec := range m.records {
		if rec.end <= m.ws || !m.snap.Visible(rec.xid) {
			continue
		}
		for k, d := range rec.deltas {
			pending[k] += d
		}
	}
	for k, d := range pending {
		if d == 0 {
			delete(pending, k)
		}
	}
	return pending
}

// Observe sees each committed transaction from the aggregator: it records
// the deltas of every transaction after M0 for the measured counter.
func (r *Recorder) Observe(xid uint32, end cdc.LSN, deltas iter.Seq2[string, int64], truncated map[string]bool, moved []counter.Move) {
	if r.active.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.byID {
		if m.gen != r.gen {
			continue
		}
		if m.m0Seen && !m.recording && xid == m.m0Xid {
			// M0's own transaction: recording starts after it.
			m.m0End, m.recording = end, true
			close(m.committed)
			continue
		}
		if !m.recording || m.invalid != nil {
			continue
		}
		if truncated[m.counter] {
			// A TRUNCATE resets the column outside the deltas, so this
			// measurement cannot be exact; it is repeated.
			m.invalid = errors.New("a TRUNCATE of the source happened during the measurement")
			continue
		}
		// A target row deleted or re-keyed moves deltas buffered before
		// it, outside the transactions recorded: such a key's result is
		// not exact, and the reconciler measures it again.
		for _, mv := range moved {
			for _, f := range []string{mv.Field, mv.To} {
				if name, key, ok := counter.SplitField(f); ok && name == m.counter {
					m.moved[key] = true
				}
			}
		}
		var rec *txnRecord
		for f, d := range deltas {
			name, key, ok := counter.SplitField(f)
			if !ok || name != m.counter {
				continue
			}
			if rec == nil {
				rec = &txnRecord{xid: xid, end: end, deltas: map[string]int64{}}
			}
			rec.deltas[key] += d
			m.recorded++
		}
		if rec == nil {
			continue
		}
		m.records = append(m.records, *rec)
		if m.recorded >= MaxRecordedDeltas {
			m.invalid = errTooManyChanges
			m.records = nil
		}
	}
}
