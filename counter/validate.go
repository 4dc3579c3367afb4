package counter

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// nameRE is what a counter name may look like: it appears in metric
// labels, log fields and Redis hash fields.
var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// Problem is one thing wrong with a counter's declaration. Field is its
// path in the configuration's terms: "counters[1] (post_likes).key".
type Problem struct {
	Field string
	Msg   string
}

// Validate checks the counters' declarations and reports every problem.
// It also puts each counter's Source and Target into canonical form
// ("schema.table", lower case, double quotes only where the name needs
// them), so that callers can compare them as strings; calling it again is
// harmless. Column names are exact names as they are in pg_attribute.
func Validate(cs []Counter) []Problem {
	var ps []Problem
	names := map[string]int{}
	// written maps "target.column" to the index of the counter writing it.
	written := map[string]int{}

	for i := range cs {
		c := &cs[i]
		field := FieldPath(i, c.Name)
		add := func(sub, format string, args ...any) {
			ps = append(ps, Problem{Field: field + "." + sub, Msg: fmt.Sprintf(format, args...)})
		}

		switch {
		case c.Name == "":
			add("name", "required")
		case !nameRE.MatchString(c.Name):
			add("name", "%q must be 1 to 63 lower-case letters, digits and underscores, starting with a letter", c.Name)
		default:
			if j, dup := names[c.Name]; dup {
				add("name", "also used by counters[%d]: names must be unique", j)
			} else {
				names[c.Name] = i
			}
		}

		table := func(sub string, v *string) bool {
			if *v == "" {
				add(sub, "required")
				return false
			}
			schema, tbl, err := parseTable(*v)
			if err != nil {
				add(sub, "%v", err)
				return false
			}
			*v = CanonicalTable(schema, tbl)
			return true
		}
		table("source", &c.Source)
		tgtOK := table("target", &c.Target)
		if c.Through != nil && c.Through.Table != "" {
			th := *c.Through
			table("via.table", &th.Table)
			c.Through = &th
		}

		column := func(sub, v string, required bool) {
			switch {
			case v == "" && required:
				add(sub, "required")
			case v == "":
			case len(v) > MaxIdentLen:
				add(sub, "%q is longer than %d bytes", v, MaxIdentLen)
			case strings.ContainsRune(v, 0):
				add(sub, "contains a NUL byte")
			}
		}
		switch {
		case c.Keyless() && c.Key != "":
			add("key", "a counter with target_row has no key: every counted row counts into that one row")
		case c.Keyless() && strings.ContainsRune(c.TargetRow, 0):
			add("target_row", "contains a NUL byte")
		default:
			column("key", c.Key, !c.Keyless())
		}
		column("target_key", c.TargetKey, true)
		column("column", c.Column, true)
		column("sum", c.Sum, false)
		column("max", c.Max, false)
		column("min", c.Min, false)
		switch {
		case c.Max != "" && c.Min != "":
			add("min", "a counter keeps max or min, not both: declare two counters")
		case c.Sum != "" && (c.Max != "" || c.Min != ""):
			add("sum", "a counter keeps a sum or an extremum (max, min), not both: declare two counters")
		case c.CreateMissing && (c.Max != "" || c.Min != ""):
			add("create_missing", "a max or min counter cannot create target rows yet: let a count or sum counter of the same target create them")
		}
		for k := range c.Where {
			column("where."+k, k, true)
		}
		for _, k := range sortedKeys(c.Filters) {
			column("where."+k, k, true)
			f := c.Filters[k]
			if _, dup := c.Where[k]; dup {
				add("where."+k, "column %q is listed twice", k)
			}
			switch f.Op {
			case OpNotNull:
				if len(f.Values) != 0 {
					add("where."+k, "IS NOT NULL takes no value")
				}
			case OpNe:
				if len(f.Values) != 1 {
					add("where."+k, "<> takes one value")
				}
			case OpIn, OpNotIn:
				if len(f.Values) == 0 {
					add("where."+k, "the list is empty: %s () matches no row", f.Op)
				}
			default:
				add("where."+k, "unknown operator %q", f.Op)
			}
		}

		for _, k := range sortedKeys(c.Defaults) {
			column("create_missing.defaults."+k, k, true)
			switch {
			case !c.CreateMissing:
				add("create_missing.defaults."+k, "defaults are for create_missing")
			case k == c.TargetKey:
				add("create_missing.defaults."+k, "%q is the target_key: a created row takes the key", k)
			case k == c.Column:
				add("create_missing.defaults."+k, "%q is the counter column: a created row's column starts at the key's delta", k)
			}
		}

		if tgtOK && c.Column != "" {
			if c.Column == c.TargetKey {
				add("column", "%q is also the target_key", c.Column)
			}
			w := c.Target + "." + c.Column
			if j, dup := written[w]; dup {
				add("column", "%s is already written by counters[%d] (%s): two counters cannot write one column", w, j, cs[j].Name)
			} else {
				written[w] = i
			}
		}
	}

	// A counter column may be summed by another counter (a multi-level
	// counter: likes → posts.likes_count → users.total_likes): walcount's
	// own flushes of the first are UPDATEs of the second's source, counted
	// like the app's. It must not be a key or where column of a counted
	// table (a count moving rows between keys or in and out of a filter at
	// every flush), and the sums must not form a cycle: a counter whose
	// column feeds, through any chain of sums, its own source column would
	// chase its own tail through the WAL forever.
	for i, c := range cs {
		for j, d := range cs {
			if c.Target != d.Source || c.Column == "" {
				continue
			}
			if c.IsVia() && d.Through != nil && d.Through.Role == "" && d.Through.Counter == c.Through.Counter {
				// The level above a via table is keyed and filtered by
				// the via table's target and passes, which change only
				// when a parent moves or enters or leaves the filter.
				continue
			}
			inWhere := slices.Contains(d.FilterColumns(), c.Column)
			ext, _ := d.Extremum()
			if (d.Key != "" && c.Column == d.Key) || (ext != "" && c.Column == ext) || inWhere {
				ps = append(ps, Problem{
					Field: FieldPath(i, c.Name) + ".column",
					Msg:   fmt.Sprintf("%s.%s is read by counters[%d] (%s): a counter column cannot be a key, max, min or where column of a counted table (only a sum may read it)", c.Target, c.Column, j, d.Name),
				})
			}
		}
	}
	if i, path := SumCycle(cs); i >= 0 {
		ps = append(ps, Problem{
			Field: FieldPath(i, cs[i].Name) + ".sum",
			Msg:   fmt.Sprintf("the counters sum each other's columns in a cycle (%s): every flush would change the column it is computed from", strings.Join(path, " → ")),
		})
	}
	return ps
}

// FieldPath names counter i in problems: "counters[1] (post_likes)".
func FieldPath(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("counters[%d]", i)
	}
	return fmt.Sprintf("counters[%d] (%s)", i, name)
}

// Feeds reports whether c's column is d's summed column: d is a level
// above c (d sums what c keeps).
func Feeds(c, d Counter) bool {
	return c.Column != "" && d.Sum != "" && c.Target == d.Source && c.Column == d.Sum
}

// SumCycle returns the index of a counter on a cycle of sums (counter i
// feeds j feeds … feeds i, see Feeds) and the cycle's counter names, or
// -1 when there is none.
func SumCycle(cs []Counter) (int, []string) {
	const (
		unseen = iota
		open
		done
	)
	state := make([]int, len(cs))
	var stack []int
	var visit func(i int) int
	visit = func(i int) int {
		state[i] = open
		stack = append(stack, i)
		for j := range cs {
			if !Feeds(cs[i], cs[j]) {
				continue
			}
			switch state[j] {
			case open:
				return j
			case unseen:
				if k := visit(j); k >= 0 {
					return k
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[i] = done
		return -1
	}
	for i := range cs {
		if state[i] != unseen {
			continue
		}
		stack = stack[:0]
		if k := visit(i); k >= 0 {
			var names []string
			from := slices.Index(stack, k)
			for _, n := range stack[from:] {
				names = append(names, cs[n].Name)
			}
			names = append(names, cs[k].Name)
			return k, names
		}
	}
	return -1, nil
}
