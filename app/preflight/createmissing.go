package preflight

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/walcount/walcount/counter"
)

// checkCreateMissing checks the counters that create missing target rows
// (create_missing), one finding per target table and cause for all the
// counters that share it: the target key needs a unique index or
// constraint of its own for ON CONFLICT, a created row must give every NOT
// NULL column without a DEFAULT a value, and the role needs INSERT on the
// columns a created row is written with.
func (r *run) checkCreateMissing() error {
	type group struct {
		tgt      *table
		idx      []int
		names    []string
		tkeys    []string
		inserted []string
	}
	var order []string
	groups := map[string]*group{}
	for i, c := range r.cfg.Counters {
		if !c.CreateMissing || c.IsVia() {
			// A via table is walcount's own, made to take created rows.
			continue
		}
		tgt, err := r.lookupTable(c.Target)
		if err != nil {
			return r.queryFailed(CheckTable, "counter "+c.Name+": target table", err)
		}
		if !tgt.Exists || (tgt.Kind != "r" && tgt.Kind != "p") {
			continue // reported by checkCounter
		}
		g := groups[c.Target]
		if g == nil {
			g = &group{tgt: tgt}
			groups[c.Target] = g
			order = append(order, c.Target)
		}
		g.idx = append(g.idx, i)
		g.names = append(g.names, c.Name)
		for _, col := range append([]string{c.TargetKey, c.Column}, slices.Sorted(maps.Keys(c.Defaults))...) {
			if !slices.Contains(g.inserted, col) {
				g.inserted = append(g.inserted, col)
			}
		}
		if !slices.Contains(g.tkeys, c.TargetKey) {
			g.tkeys = append(g.tkeys, c.TargetKey)
		}
	}
	for _, name := range order {
		g := groups[name]
		who := "counter " + g.names[0]
		if len(g.names) > 1 {
			who = "counters " + strings.Join(g.names, ", ")
		}
		ok := true
		for _, k := range g.tkeys {
			col, found := g.tgt.Columns[k]
			if !found || col.Unique {
				continue
			}
			ok = false
			r.problem(CheckColumn, fmt.Sprintf("%s: create_missing needs a unique index or constraint on %s.%s alone, which INSERT ... ON CONFLICT (%s) uses, and %s has none",
				who, g.tgt.sql, r.ident(k), r.ident(k), g.tgt.sql),
				fmt.Sprintf("ALTER TABLE %s ADD UNIQUE (%s);", g.tgt.sql, r.ident(k)))
		}
		// Counters that miss the same columns share one finding.
		var causes []string
		missingBy := map[string][]int{}
		for _, i := range g.idx {
			c := r.cfg.Counters[i]
			for _, d := range slices.Sorted(maps.Keys(c.Defaults)) {
				col, found := g.tgt.Columns[d]
				switch {
				case !found:
					ok = false
					r.configProblem(CheckColumn, fmt.Sprintf("counter %s: create_missing.defaults names %s.%s, which does not exist", c.Name, g.tgt.sql, r.ident(d)),
						fmt.Sprintf("fix counters[%d].create_missing.defaults in %s", i, r.configFileName()))
				case col.Generated:
					ok = false
					r.configProblem(CheckColumn, fmt.Sprintf("counter %s: create_missing.defaults names %s.%s, a generated column, which an INSERT cannot set", c.Name, g.tgt.sql, r.ident(d)),
						fmt.Sprintf("remove it from counters[%d].create_missing.defaults in %s", i, r.configFileName()))
				}
			}
			if m := counter.MissingDefaults(c, g.tgt.Table); len(m) > 0 {
				cause := strings.Join(m, ", ")
				if _, seen := missingBy[cause]; !seen {
					causes = append(causes, cause)
				}
				missingBy[cause] = append(missingBy[cause], i)
			}
		}
		for _, cause := range causes {
			ok = false
			is := missingBy[cause]
			var names, fields, cols, vals []string
			for _, i := range is {
				names = append(names, r.cfg.Counters[i].Name)
				fields = append(fields, fmt.Sprintf("counters[%d]", i))
			}
			for _, col := range strings.Split(cause, ", ") {
				cols = append(cols, r.ident(col))
				vals = append(vals, col+": <value>")
			}
			r.configProblem(CheckColumn, fmt.Sprintf("counter%s %s: a target row created in %s would leave NOT NULL column%s %s without a value (no DEFAULT, no create_missing default)",
				plural(len(names)), strings.Join(names, ", "), g.tgt.sql, plural(len(cols)), strings.Join(cols, ", ")),
				fmt.Sprintf("add create_missing: {defaults: {%s}} to %s in %s, or give the column%s a DEFAULT (ALTER TABLE %s ALTER COLUMN %s SET DEFAULT <value>;)",
					strings.Join(vals, ", "), strings.Join(fields, ", "), r.configFileName(), plural(len(cols)), g.tgt.sql, cols[0]))
		}
		var lacking []string
		for _, col := range g.inserted {
			if _, found := g.tgt.Columns[col]; !found {
				continue // reported by checkColumns
			}
			var has bool
			if err := r.conn.QueryRow(r.ctx, "SELECT has_column_privilege($1::oid, $2::text, 'INSERT')", g.tgt.OID, col).Scan(&has); err != nil {
				return r.queryFailed(CheckPrivilege, who+": privileges on "+g.tgt.sql, err)
			}
			if !has {
				lacking = append(lacking, r.ident(col))
			}
		}
		if len(lacking) > 0 {
			ok = false
			r.accessProblem(CheckPrivilege, fmt.Sprintf("%s: role %s lacks INSERT on %s (%s), which creating missing rows needs",
				who, r.user, g.tgt.sql, strings.Join(lacking, ", ")),
				fmt.Sprintf("GRANT INSERT (%s) ON %s TO %s;", strings.Join(lacking, ", "), g.tgt.sql, r.ident(r.user)))
		}
		if ok {
			r.ok(CheckColumn, fmt.Sprintf("%s: a missing row of %s is created (INSERT ... ON CONFLICT (%s) DO UPDATE) with %s",
				who, g.tgt.sql, strings.Join(identAll(r, g.tkeys), ", "), strings.Join(identAll(r, g.inserted), ", ")))
		}
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func identAll(r *run, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = r.ident(n)
	}
	return out
}
