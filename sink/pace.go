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
// statements, an underestimate a long lock.
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
