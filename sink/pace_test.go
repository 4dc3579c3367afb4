package sink

import (
	"slices"
	"testing"
	"time"
)

// TestPacerShrinksStatementsOfSlowRows: the statements are sized by the
// time per key of those before, so slow rows give small statements, a
// statement grows at most twofold at a time, and the budget spent ends
// the transaction.
func TestPacerShrinksStatementsOfSlowRows(t *testing.T) {
	const budget = 200 * time.Millisecond
	var p pacer
	n, ok := p.size(budget, 0, 0, 5000)
	if !ok || n != firstStatementKeys {
		t.Fatalf("first statement: %d, %v; want %d", n, ok, firstStatementKeys)
	}
	// Fast rows: 10 µs a key. The statement grows, twofold at a time,
	// to what takes a quarter of the budget (5,000 keys), at most.
	p.learn(n, time.Duration(n)*10*time.Microsecond)
	last := n
	for range 10 {
		next, _ := p.size(budget, 0, last, 5000)
		if next > 2*last {
			t.Fatalf("grew from %d to %d", last, next)
		}
		last = next
		p.learn(next, time.Duration(next)*10*time.Microsecond)
	}
	if last != 5000 {
		t.Fatalf("fast rows: %d keys a statement, want the limit 5000", last)
	}
	// The rows turn slow: 2 ms a key. The next statement is sized for
	// it at once: a quarter of 200 ms is 25 keys.
	p.learn(last, time.Duration(last)*2*time.Millisecond)
	if n, _ := p.size(budget, 0, last, 5000); n != 25 {
		t.Fatalf("slow rows: %d keys a statement, want 25", n)
	}
	// Near the end of the budget a statement takes what is left.
	if n, _ := p.size(budget, budget-10*time.Millisecond, 25, 5000); n != 5 {
		t.Fatalf("10 ms left: %d keys, want 5", n)
	}
	if _, ok := p.size(budget, budget, 25, 5000); ok {
		t.Fatal("the budget is spent, yet another statement")
	}
	if p.fits(150, budget) || !p.fits(150, time.Second) {
		t.Fatal("150 keys of 2 ms fit 1 s, not 200 ms")
	}
	// A statement of one key that took 5 ms says nothing of the pace.
	before := p.perKey
	p.learn(1, 5*time.Millisecond)
	if p.perKey != before {
		t.Fatalf("a one-key statement changed the pace from %s to %s", before, p.perKey)
	}
}

// TestPacerLeavesOutTheFixedCost: statements of a few keys that take
// 20 ms each (round trips on a loaded machine) do not make the pacer take
// the rows for slow: the statements grow again.
func TestPacerLeavesOutTheFixedCost(t *testing.T) {
	const budget = 200 * time.Millisecond
	p := pacer{perKey: 10 * time.Millisecond} // as if a hiccup taught it
	last := 2
	for range 30 {
		n, _ := p.size(budget, 0, last, 5000)
		// 20 ms per statement, plus 10 µs a key.
		p.learn(n, 20*time.Millisecond+time.Duration(n)*10*time.Microsecond)
		last = n
	}
	if last < 1000 {
		t.Fatalf("statements of %d keys after 30 of them, want them grown back past 1000", last)
	}
}

// TestPacerLearnsFastRowsFromSmallStatements: a pace taught by a hiccup
// (10 ms a key) sizes statements of a handful of keys; when they then take
// a couple of milliseconds each, fewer than learnKeys keys in less than
// learnTime, they still bring the pace down (their time per key, fixed
// cost included, bounds the rows' own), and the statements grow back.
// Before, such statements taught nothing: every later flush was judged too
// big for one transaction and applied in pieces of a few keys each
// (TestCutoverFollowsThePage on a busy machine: 1,000 keys in 47
// transactions, 19 s).
func TestPacerLearnsFastRowsFromSmallStatements(t *testing.T) {
	const budget = 200 * time.Millisecond
	p := pacer{perKey: 10 * time.Millisecond}
	last := 5
	for range 30 {
		n, _ := p.size(budget, 0, last, 5000)
		p.learn(n, 2*time.Millisecond+time.Duration(n)*10*time.Microsecond)
		last = n
	}
	if last < 1000 || !p.fits(1000, budget) {
		t.Fatalf("statements of %d keys after 30 of them (pace %s a key), want them grown back past 1000", last, p.perKey)
	}
}

// TestStatementsLoop: the pacing loop replays the sizes of the try
// before, records its own, stops when no keys remain or the room is
// gone, and once the budget is spent ends the transaction, or, with
// overrun, goes on at the size of a transaction's first statement.
func TestStatementsLoop(t *testing.T) {
	const budget = 200 * time.Millisecond
	var sizes []int
	st := &statements{pace: &pacer{}, budget: budget, replay: []int{3, 7}, sizes: &sizes}
	var ran []int
	left := 20
	spent, err := st.run(func() int { return 5000 }, func(n int) (int, bool, error) {
		st.locking()
		took := min(n, left)
		ran = append(ran, took)
		left -= took
		return took, left > 0, nil
	})
	if err != nil || spent {
		t.Fatalf("run: spent %v, %v", spent, err)
	}
	// 3 and 7 replayed, then the pacer's first size (100), at most twice
	// the statement before (14), takes the 10 keys left.
	if want := []int{3, 7, 10}; !slices.Equal(ran, want) {
		t.Fatalf("statements of %v keys, want %v", ran, want)
	}
	if want := []int{3, 7, 14}; !slices.Equal(sizes, want) {
		t.Fatalf("recorded sizes %v, want %v", sizes, want)
	}

	// The room gone: no statement.
	calls := 0
	if spent, err := st.run(func() int { return 0 }, func(int) (int, bool, error) { calls++; return 1, true, nil }); spent || err != nil || calls != 0 {
		t.Fatalf("no room: spent %v, %v, %d statements", spent, err, calls)
	}

	// The budget spent since the first statement locked rows.
	for _, overrun := range []bool{false, true} {
		var sizes []int
		st := &statements{pace: &pacer{}, budget: budget, overrun: overrun, sizes: &sizes, locked: time.Now().Add(-budget)}
		calls := 0
		spent, err := st.run(func() int { return 5000 }, func(n int) (int, bool, error) {
			calls++
			if n != firstStatementKeys {
				t.Errorf("overrun statement of %d keys, want %d", n, firstStatementKeys)
			}
			return n, false, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := !overrun; spent != want || calls != map[bool]int{false: 0, true: 1}[overrun] {
			t.Fatalf("overrun %v: spent %v (want %v) after %d statements", overrun, spent, want, calls)
		}
	}
}
