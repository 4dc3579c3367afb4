package reconcile

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/state"
)

// maxRemeasures bounds how often a key whose target row keeps being
// deleted or re-keyed during its measurements is measured afresh, and how
// often a key whose measurements disagree is measured again.
const maxRemeasures = 3

// passIO is what a pass does outside itself: measure through the stream,
// carry corrections through the WAL, save its progress. The Reconciler is
// the one implementation; tests of the pass logic give it a model.
type passIO interface {
	measure(ctx context.Context, rq *roundRequest) (roundResult, error)
	// emit sends corrections into the WAL and returns a position past
	// them: they are in the counter columns once W reaches it.
	emit(ctx context.Context, drift []KeyDrift) (cdc.LSN, error)
	// applied waits until W reaches lsn.
	applied(ctx context.Context, lsn cdc.LSN) error
	// progress saves the run (renewing its lease) and publishes it; drift
	// holds the drifted keys of the batches saved now.
	progress(ctx context.Context, run *RunInfo, drift []KeyDrift) error
	// checked counts keys checked and corrections applied, for metrics.
	checked(keys, corrected int)
	// idle waits while the stream is behind.
	idle(ctx context.Context)
}

// suspect is a key a measurement found off (or could not measure
// exactly), to be measured again in the next round.
type suspect struct {
	// prev is the correction the previous measurement found; fresh means
	// there is none to compare with, so the next measurement is the
	// key's first.
	prev  int64
	fresh bool
	// origin is the batch the key belongs to.
	origin *batch
	// tries counts the measurements afresh of a key whose deltas a
	// target lifecycle event moved, disagreed the measurements that
	// disagreed with the one before; each is bounded by maxRemeasures.
	tries, disagreed int
}

// batch is one range of keys of a pass (a survey's range, or a slice of a
// run's keys). It is saved once every key of it is settled, in order, so
// that a pass resumed after a restart goes on after the last saved batch
// and counts each key once.
type batch struct {
	last      string
	keys      int64
	open      int // suspects not settled
	drifted   int64
	corrected int64
	drift     []KeyDrift
}

// confirmedDrift is a key whose two measurements agree.
type confirmedDrift struct {
	KeyDrift
	origin *batch
}

// pass walks the keys of one counter in rounds. Each round is one
// measurement (one snapshot, bracketed by markers) that reads the next
// batch of keys and measures again the suspects of the rounds before:
//
//   - a full run's batch is surveyed: one query compares the column with
//     the true value of every key of a range and returns only the keys
//     that differ; with pending(k) from the recorder, that is the exact
//     first measurement of every key of the range, and a key whose
//     correction is non-zero becomes a suspect;
//   - a run limited to some keys (dirty marks) reads them one by one;
//   - suspects are read one by one, in the same snapshot, and a key is
//     corrected only when this second, independent measurement finds the
//     same correction as the first; when the two disagree, one of them
//     was off for a moment and the key is measured again, until two
//     measurements in a row agree (at most maxRemeasures more times).
//
// Corrections are emitted after the round, in messages of their own, and
// counted once W passed them: the next round's wait for W covers them. Keys that are not off cost nothing beyond
// their share of the survey, so a pass reads each key once and makes one
// stream round trip per batch.
type pass struct {
	io      passIO
	log     *zap.Logger
	counter string
	dry     bool
	// backfill is set for a counter's first count: its corrections are
	// no drift, and each is logged at debug only.
	backfill bool
	// logs limits the per-key lines of a reconcile (a burst, then one a
	// second); notLogged counts the corrections it kept quiet.
	logs      driftLogLimit
	notLogged int64
	size      int // keys per batch
	pacer     *Pacer
	// sv surveys a full run; keys is the sorted key list of a run limited
	// to some keys (sv is nil then).
	sv   *survey
	keys []string
	run  *RunInfo

	after     string // the last key read
	exhausted bool
	suspects  map[string]*suspect
	batches   []*batch // read, not yet saved, in key order
	// unapplied are corrections emitted up to unappliedEnd that W has
	// not passed yet. The next measurement waits for W to pass its M0,
	// emitted after them, so it finds them applied; the last ones are
	// waited for.
	unapplied    []confirmedDrift
	unappliedEnd cdc.LSN
	// unsettled are the keys whose measurements kept disagreeing: not
	// corrected, and not known exact either, so the counter's pass marks
	// them dirty for a later repair (reconcileCounter).
	unsettled []string
}

func (p *pass) execute(ctx context.Context) error {
	p.after = p.run.LastKey
	p.suspects = map[string]*suspect{}
	for !p.exhausted || len(p.suspects) > 0 {
		rq := roundRequest{}
		var fresh []string
		n := 0
		if !p.exhausted {
			n = p.pacer.Batch(p.size)
			if p.sv != nil {
				rq.survey, rq.after, rq.limit = p.sv, p.after, n
			} else {
				fresh = nextKeys(p.keys, p.after, n)
				n = len(fresh)
			}
		}
		again := slices.Sorted(maps.Keys(p.suspects))
		rq.keys = append(slices.Clone(fresh), again...)
		if rq.survey == nil && len(rq.keys) == 0 {
			p.exhausted = true // a run's keys are all read: nothing to measure
			continue
		}
		if err := p.pacer.Wait(ctx, n+len(again)); err != nil {
			return err
		}
		res, err := p.io.measure(ctx, &rq)
		if err != nil {
			return err
		}
		if len(p.unapplied) > 0 && res.ws >= p.unappliedEnd {
			p.credit()
		}
		var b *batch
		switch {
		case p.exhausted:
		case p.sv != nil && res.surveyed.n > 0:
			b = &batch{last: res.surveyed.last, keys: res.surveyed.n}
		case p.sv == nil && len(fresh) > 0:
			b = &batch{last: fresh[len(fresh)-1], keys: int64(len(fresh))}
		default:
			p.exhausted = true
		}
		confirmed := p.evaluate(&rq, &res, fresh, b)
		if b != nil {
			p.batches = append(p.batches, b)
			p.after = b.last
		}
		if err := p.settle(ctx, confirmed); err != nil {
			return err
		}
		if err := p.save(ctx); err != nil {
			return err
		}
		p.io.idle(ctx)
	}
	if len(p.unapplied) == 0 {
		return nil
	}
	if err := p.io.applied(ctx, p.unappliedEnd); err != nil {
		return err
	}
	p.credit()
	p.recount()
	return p.save(ctx)
}

// evaluate turns a round's result into the next round's suspects and the
// keys whose two measurements agree.
func (p *pass) evaluate(rq *roundRequest, res *roundResult, fresh []string, b *batch) []confirmedDrift {
	next := make(map[string]*suspect)
	defer func() { p.suspects = next }()
	var confirmed []confirmedDrift
	measured := make(map[string]bool, len(rq.keys))
	for _, k := range rq.keys {
		measured[k] = true
	}
	// remeasure makes k a fresh suspect: its result this round is not
	// exact (a target lifecycle event moved its deltas) or not known
	// (a key of an unordered type the survey may not have covered).
	remeasure := func(k string, origin *batch, tries int) {
		if tries >= maxRemeasures {
			p.log.Warn("key not measured: its target row kept changing during the measurements", zap.String("counter", p.counter), zap.String("key", k))
			return
		}
		next[k] = &suspect{fresh: true, origin: origin, tries: tries + 1}
	}
	first := func(k string, corr int64, origin *batch) {
		if corr != 0 {
			next[k] = &suspect{prev: corr, origin: origin}
		}
	}
	disagree := func(k string, corr int64, s *suspect) {
		if s.disagreed >= maxRemeasures {
			p.log.Warn("key not corrected: its measurements kept disagreeing (is something other than walcount writing its column?); marked dirty for a later repair",
				zap.String("counter", p.counter), zap.String("key", k), zap.Int64("correction", corr), zap.Int64("previous", s.prev))
			p.unsettled = append(p.unsettled, k)
			return
		}
		next[k] = &suspect{prev: corr, origin: s.origin, tries: s.tries, disagreed: s.disagreed + 1}
	}

	// The suspects of the rounds before, measured again.
	for k, s := range p.suspects {
		if res.moved[k] {
			remeasure(k, s.origin, s.tries)
			continue
		}
		corr, cached, ok := res.correction(k)
		switch {
		case !ok:
			// No target row any more: nothing to correct.
		case s.fresh:
			first(k, corr, s.origin)
		case corr == s.prev:
			// Two measurements agree: the drift, or none (a zero after
			// a disagreement).
			if corr != 0 {
				confirmed = append(confirmed, confirmedDrift{origin: s.origin,
					KeyDrift: KeyDrift{Counter: p.counter, Key: k, Cached: cached, True: res.truth[k], Correction: corr}})
			}
		default:
			// The two disagree: one was off for a moment, as when the
			// stream applied a source transaction to the column before
			// the snapshot saw it committed (its commit record is in the
			// WAL before it leaves the running transactions). Dropping
			// the key would leave its real drift for good; it is
			// measured again until two measurements agree.
			disagree(k, corr, s)
		}
	}
	if b == nil {
		return confirmed
	}
	// A run's keys, measured for the first time.
	for _, k := range fresh {
		if res.moved[k] {
			remeasure(k, b, 0)
			continue
		}
		if corr, _, ok := res.correction(k); ok {
			first(k, corr, b)
		}
	}
	if p.sv == nil {
		return confirmed
	}
	// The survey: every key of the range whose column differs from its
	// true value in the snapshot...
	for k, v := range res.surveyed.off {
		switch {
		case measured[k]:
		case res.moved[k]:
			remeasure(k, b, 0)
		default:
			corr, _ := res.off(k, v.truth, v.column)
			first(k, corr, b)
		}
	}
	// ... and every key of the range with deltas on their way, whose
	// column equals its true value in the snapshot: its correction is
	// −pending(k) (none for a max or min, whose pending deltas are
	// recomputes). Keys of other ranges are left to their own.
	for k := range res.pending {
		if _, off := res.surveyed.off[k]; off || measured[k] {
			continue
		}
		in, known := p.sv.inRange(k, rq.after, b.last)
		switch {
		case known && !in:
		case !known || res.moved[k]:
			remeasure(k, b, 0)
		default:
			corr, _ := res.off(k, 0, 0) // column = truth
			first(k, corr, b)
		}
	}
	for k := range res.moved {
		if _, off := res.surveyed.off[k]; off || measured[k] || res.pending[k] != 0 {
			continue
		}
		if in, known := p.sv.inRange(k, rq.after, b.last); !known || in {
			remeasure(k, b, 0)
		}
	}
	return confirmed
}

// settle emits the corrections of the confirmed drift (in a dry run, only
// reports it) and counts the drift against the batches the keys belong
// to. A correction counts as applied once W has passed it (see credit).
func (p *pass) settle(ctx context.Context, confirmed []confirmedDrift) error {
	for _, d := range confirmed {
		d.origin.drifted++
		if len(d.origin.drift) < state.MaxDriftSamples {
			d.origin.drift = append(d.origin.drift, d.KeyDrift)
		}
	}
	if p.dry {
		for _, d := range confirmed {
			p.log.Info("drift found (dry run, not corrected)", zap.String("counter", d.Counter), zap.String("key", d.Key),
				zap.Int64("cached", d.Cached), zap.Int64("true", d.True), zap.Int64("correction", d.Correction))
		}
	} else if len(confirmed) > 0 {
		drift := make([]KeyDrift, len(confirmed))
		for i, d := range confirmed {
			drift[i] = d.KeyDrift
		}
		end, err := p.io.emit(ctx, drift)
		if err != nil {
			return err
		}
		p.unapplied, p.unappliedEnd = append(p.unapplied, confirmed...), end
	}
	p.recount()
	return nil
}

// credit counts the unapplied corrections as applied: W has passed them.
func (p *pass) credit() {
	for _, d := range p.unapplied {
		d.origin.corrected++
		level := zap.WarnLevel
		if p.backfill || !p.logs.allow(time.Now()) {
			level = zap.DebugLevel
			if !p.backfill {
				p.notLogged++
			}
		}
		p.log.Log(level, "corrected drift", zap.String("counter", d.Counter), zap.String("key", d.Key),
			zap.Int64("cached", d.Cached), zap.Int64("true", d.True), zap.Int64("correction", d.Correction))
	}
	p.io.checked(0, len(p.unapplied))
	p.unapplied = nil
}

// DriftLogBurst is how many corrections of a reconcile are logged one by
// one at WARN before the rate limit (one a second) applies; the rest are
// at debug, and the counter's summary line says how many.
const DriftLogBurst = 20

// driftLogLimit is a token bucket of DriftLogBurst tokens refilled at one
// a second.
type driftLogLimit struct {
	tokens float64
	last   time.Time
}

func (l *driftLogLimit) allow(now time.Time) bool {
	if l.last.IsZero() {
		l.tokens = DriftLogBurst
	} else {
		l.tokens = min(DriftLogBurst, l.tokens+now.Sub(l.last).Seconds())
	}
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// recount sets each batch's number of open suspects.
func (p *pass) recount() {
	for _, b := range p.batches {
		b.open = 0
	}
	for _, s := range p.suspects {
		s.origin.open++
	}
	for _, d := range p.unapplied {
		d.origin.open++
	}
}

// save saves the batches whose keys are all settled, in order, and renews
// the run's lease.
func (p *pass) save(ctx context.Context) error {
	var drift []KeyDrift
	keys := 0
	for len(p.batches) > 0 && p.batches[0].open == 0 {
		b := p.batches[0]
		p.batches = p.batches[1:]
		p.run.KeysChecked += b.keys
		p.run.Drifted += b.drifted
		p.run.Corrected += b.corrected
		p.run.LastKey = b.last
		keys += int(b.keys)
		drift = append(drift, b.drift...)
	}
	if keys > 0 {
		p.io.checked(keys, 0)
	}
	return p.io.progress(ctx, p.run, drift)
}

// nextKeys returns up to n of the sorted keys after last ("" for the
// first).
func nextKeys(keys []string, last string, n int) []string {
	i := 0
	if last != "" {
		i, _ = slices.BinarySearch(keys, last)
		if i < len(keys) && keys[i] == last {
			i++
		}
	}
	return keys[i:min(i+n, len(keys))]
}
