package sink

import "time"

// The statements of a flush are sized by how long they take, not by a
// fixed count of keys: a statement's row locks are held from the moment
// it updates a row until its transaction commits, and a flush that checks
// its time only after a statement of 5,000 keys holds them for as long as
// that statement takes on a slow or loaded machine (issue 26: up to 2 s).
const (
	// firstStatementKeys is the size of a flush statement before any has
	// been timed.
	firstStatementKeys = 100
	// minStatementKeys is the smallest statement: however slow the rows,
	// a statement makes progress.
	minStatementKeys = 1
	// statementShare: a statement is sized to take at most this share of
	// the transaction's time (TransactionTime).
	statementShare = 4
	// learnKeys and learnTime: a statement teaches the pace only when it
	// carried this many keys or took this long, so that the fixed cost of
	// a round trip is not taken for the cost of its one key.
	learnKeys = 100
	learnTime = 20 * time.Millisecond
)

// smallKeys: a statement of at most this many keys shows the fixed cost
// of a statement (its round trips), which the time per key leaves out.
const smallKeys = 10

// pacer estimates how long a flush statement takes per key, across
// flushes, and sizes the next statement from it. A statement costs a
// fixed part (round trips, the page read, the carried rows' write) and a
// part per key; the fixed part, learnt from the smallest statements, is
// taken off before the time per key is: else a few statements of a
// handful of keys on a loaded machine would look like slow rows, size the
// next statements at a handful of keys, and keep it so.
type pacer struct {
	perKey time.Duration // 0 until a statement was timed
	fixed  time.Duration // the smallest statements' time, 0 until one ran
}

// size returns how many keys the next statement takes, given the
// transaction's time budget, the time since its first statement updated a
// row (elapsed), the size of the statement before (last, 0 for the first)
// and the most it may take (limit). ok is false once the budget is spent:
// the transaction commits.
func (p *pacer) size(budget, elapsed time.Duration, last, limit int) (n int, ok bool) {
	left := budget - elapsed
	if left <= 0 {
		return 0, false
	}
	target := min(budget/statementShare, left)
	switch {
	case p.perKey <= 0:
		n = firstStatementKeys
	default:
		n = int(min(int64(target/p.perKey), int64(limit)))
	}
	if last > 0 {
		// A faster estimate grows a statement at most twofold at a time.
		n = min(n, 2*last)
	}
	return max(minStatementKeys, min(n, limit)), true
}

// fits reports whether keys updated in one transaction are expected to
// take at most budget.
func (p *pacer) fits(keys int64, budget time.Duration) bool {
	return p.perKey <= 0 || time.Duration(keys)*p.perKey <= budget
}

// learn takes the time of a statement of keys keys. A slower pace is
// taken at once, a faster one halfway at a time: an overestimate costs a few more
// statements, an underestimate a long lock. A statement of few keys that
// took little time only ever lowers the pace.
func (p *pacer) learn(keys int, took time.Duration) {
	if keys <= 0 {
		return
	}
	if keys <= smallKeys {
		if p.fixed <= 0 || took < p.fixed {
			p.fixed = took
		} else {
			p.fixed += (took - p.fixed) / 8
		}
	}
	if keys < learnKeys && took < learnTime {
		// Too small to say the rows are slow, but its time per key,
		// fixed cost included, bounds theirs: it may only bring a pace
		// down (halfway), or a pace taught by a hiccup would size
		// statements this small for good.
		if s := took / time.Duration(keys); s < p.perKey {
			p.perKey = (p.perKey + max(s, 1)) / 2
		}
		return
	}
	s := (took - p.fixed) / time.Duration(keys)
	if s <= 0 {
		s = 1
	}
	if s > p.perKey {
		p.perKey = s
		return
	}
	p.perKey = (p.perKey + s) / 2
}

// statements runs the statements of one flush transaction that update
// target rows, one after another, each sized by the flusher's pacer so
// that the transaction commits about budget after its first statement
// locked a row, however slow the rows are; each teaches the pacer its
// time. It is the one pacing loop of the flush: the one-transaction apply
// runs its chunks with it, and each piece of a big batch its pages.
type statements struct {
	pace   *pacer
	budget time.Duration
	// overrun: once the budget is spent, the statements go on at the
	// size of a transaction's first instead of stopping (a TRUNCATE
	// barrier's transaction, which cannot be cut in pieces).
	overrun bool
	// replay are the sizes of the try before (see isolate), which a retry
	// uses again so that its chunks are the same; sizes receives the
	// size of each statement of this try.
	replay []int
	sizes  *[]int
	// locked is when the first statement that updates target rows began:
	// their row locks are held from then until the commit.
	locked time.Time
	last   int // the size of the statement before
}

// locking tells the loop that the statement running now updates target
// rows; the budget runs from the first one.
func (s *statements) locking() {
	if s.locked.IsZero() {
		s.locked = time.Now()
	}
}

// run runs statements until room returns 0, a statement reports that no
// keys remain, or the budget is spent (spent; never with overrun). room
// returns the most keys the next statement may take; step runs one of at
// most n keys and returns how many it took and whether keys remain.
func (s *statements) run(room func() int, step func(n int) (took int, more bool, err error)) (spent bool, err error) {
	for {
		limit := room()
		if limit <= 0 {
			return false, nil
		}
		n, ok := s.next(limit)
		if !ok {
			return true, nil
		}
		began := time.Now()
		took, more, err := step(n)
		if err != nil {
			return false, err
		}
		s.pace.learn(took, time.Since(began))
		s.last = took
		if !more {
			return false, nil
		}
	}
}

// next returns the size of the next statement, at most limit, and false
// once the budget is spent.
func (s *statements) next(limit int) (int, bool) {
	var n int
	if i := len(*s.sizes); i < len(s.replay) {
		n = s.replay[i]
	} else {
		var elapsed time.Duration
		if !s.locked.IsZero() {
			elapsed = time.Since(s.locked)
		}
		var ok bool
		if n, ok = s.pace.size(s.budget, elapsed, s.last, limit); !ok {
			if !s.overrun {
				return 0, false
			}
			n, _ = s.pace.size(s.budget, 0, s.last, limit)
		}
	}
	*s.sizes = append(*s.sizes, n)
	return n, true
}
