package reconcile

import (
	"slices"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// dependsOn reports whether counter d is computed from what counter c
// keeps: d sums c's column (a level above, counter.Feeds), or c is one of
// the counters of d's via table (d is the level above it).
func dependsOn(d, c counter.Counter) bool {
	if counter.Feeds(c, d) {
		return true
	}
	return c.IsVia() && d.Through != nil && d.Through.Role == "" && d.Through.Counter == c.Through.Counter
}

// backfillsAfter reports whether the backfill must take counter d after
// counter c of cs: d depends on c, or d creates target rows and another
// counter of its target depends on c. A created row's every counter
// column is set from its source rows in the seed's transaction
// (seedTargets), which must not read a via table or a level below that
// is not counted yet.
func backfillsAfter(cs []counter.Counter, d, c counter.Counter) bool {
	if dependsOn(d, c) {
		return true
	}
	if !d.CreateMissing || d.IsVia() {
		return false
	}
	return slices.ContainsFunc(cs, func(o counter.Counter) bool {
		return o.Name != d.Name && o.Target == d.Target && !o.IsVia() && dependsOn(o, c)
	})
}

// BackfillOrder returns the counters of names to backfill in the order a
// backfill must take them (docs/design.md §5, "Backfill order"): every
// counter after the counters it is computed from, so that no counter is
// measured, and corrected, against a via table or a level below that is
// not counted yet; otherwise in the order of cs. The level above a via
// counter in names is added when it is not there: a via counter's
// backfill corrections are quiet (they do not reach the level above), so
// the level above must be measured after them.
func BackfillOrder(cs []counter.Counter, names []string) []string {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, c := range cs {
		if !want[c.Name] || !c.IsVia() {
			continue
		}
		for _, d := range cs {
			if dependsOn(d, c) && d.Through != nil && d.Through.Role == "" {
				want[d.Name] = true
			}
		}
	}
	var todo []counter.Counter
	for _, c := range cs {
		if want[c.Name] {
			todo = append(todo, c)
			delete(want, c.Name)
		}
	}
	out := make([]string, 0, len(todo)+len(want))
	for len(todo) > 0 {
		// The first counter (in cs's order) that is computed from none
		// of the others left.
		i := slices.IndexFunc(todo, func(d counter.Counter) bool {
			return !slices.ContainsFunc(todo, func(c counter.Counter) bool { return c.Name != d.Name && backfillsAfter(cs, d, c) })
		})
		if i < 0 {
			i = 0 // a cycle, which counter.Validate refuses: keep cs's order
		}
		out = append(out, todo[i].Name)
		todo = slices.Delete(todo, i, i+1)
	}
	// Names no counter has (not configured any more) keep their place at
	// the end; the run fails on them as before.
	for _, n := range names {
		if want[n] {
			out = append(out, n)
		}
	}
	return out
}

// quietAbove returns the level above via counter c when run backfills it
// after c, else "": then c's corrections are written into its via table
// quietly (correctVia), and the level above's own backfill counts them.
func quietAbove(run *RunInfo, c counter.Counter) string {
	if run.Kind != state.KindBackfill || run.DryRun || !c.IsVia() {
		return ""
	}
	top := c.Through.Counter
	i, j := slices.Index(run.Counters, c.Name), slices.Index(run.Counters, top)
	if i < 0 || j <= i {
		return ""
	}
	return top
}
