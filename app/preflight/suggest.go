package preflight

import (
	"fmt"
	"strings"

	"github.com/walcount/walcount/counter"
)

// This file holds the "did you mean" of the checks: a name the
// configuration gives that the catalog lacks is matched against the names it
// has, by edit distance.

// closest returns the column of cols nearest to name by edit distance, for
// a "did you mean" in a message; empty when none is near enough to be a
// likely typo (at most a third of the name's length, and at least 1
// edit allowed, 3 at most).
func closest(name string, cols map[string]counter.Column) string {
	limit := min(max(len([]rune(name))/3, 1), 3)
	best, bestDist := "", limit+1
	for _, col := range sortedKeys(cols) {
		if d := editDistance(strings.ToLower(name), strings.ToLower(col)); d < bestDist {
			best, bestDist = col, d
		}
	}
	return best
}

// missingCounterColumn reports a counter column that does not exist in
// the target, with the statement that adds it as typ. A column of the target
// within a few edits of the name is most likely what the configuration
// meant (like_count for likes_count): it is named first, and the fix
// offers the configuration's change before the ALTER TABLE.
func (r *run) missingCounterColumn(i int, c counter.Counter, tgt *table, prefix, typ string) {
	msg := fmt.Sprintf("%scounter column %s.%s does not exist", prefix, tgt.sql, r.ident(c.Column))
	fix := fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s; then walcount reconcile", tgt.sql, r.ident(c.Column), typ)
	if near := closest(c.Column, tgt.Columns); near != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", r.ident(near))
		fix = fmt.Sprintf("set counters[%d].column in %s to %s if that is the column meant; else %s", i, r.configFileName(), r.ident(near), fix)
	}
	r.problem(CheckColumn, msg, fix)
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
