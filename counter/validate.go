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
//
// Each counter is checked on its own first, part by part in the order of
// its declaration (name, tables, key, columns, kind, where, defaults, the
// column it writes); then the counters against each other (a counter
// column read by another counter, a cycle of sums).
func Validate(cs []Counter) []Problem {
	v := &validator{names: map[string]int{}, written: map[string]int{}}
	for i := range cs {
		d := declaration{v: v, cs: cs, i: i, c: &cs[i], field: FieldPath(i, cs[i].Name)}
		d.checkName()
		tgtOK := d.checkTables()
		d.checkKey()
		d.checkColumns()
		d.checkKind()
		d.checkWhere()
		d.checkDefaults()
		d.checkWritten(tgtOK)
	}
	v.checkReadColumns(cs)
	if i, path := SumCycle(cs); i >= 0 {
		v.ps = append(v.ps, Problem{
			Field: FieldPath(i, cs[i].Name) + ".sum",
			Msg:   fmt.Sprintf("the counters sum each other's columns in a cycle (%s): every flush would change the column it is computed from", strings.Join(path, " → ")),
		})
	}
	return v.ps
}

// validator holds what Validate learns across the counters: the problems
// so far, the index of each name and of each column written.
type validator struct {
	ps    []Problem
	names map[string]int
	// written maps "target.column" to the index of the counter writing it.
	written map[string]int
}

// declaration is one counter under Validate's checks: counters[i].
type declaration struct {
	v     *validator
	cs    []Counter
	i     int
	c     *Counter
	field string
}

// add reports a problem with the counter's field sub.
func (d declaration) add(sub, format string, args ...any) {
	d.v.ps = append(d.v.ps, Problem{Field: d.field + "." + sub, Msg: fmt.Sprintf(format, args...)})
}

// checkName holds the name to nameRE and to being unique.
func (d declaration) checkName() {
	c := d.c
	switch {
	case c.Name == "":
		d.add("name", "required")
	case !nameRE.MatchString(c.Name):
		d.add("name", "%q must be 1 to 63 lower-case letters, digits and underscores, starting with a letter", c.Name)
	default:
		if j, dup := d.v.names[c.Name]; dup {
			d.add("name", "also used by counters[%d]: names must be unique", j)
		} else {
			d.v.names[c.Name] = d.i
		}
	}
}

// checkTables parses source, target and via.table and puts them into
// canonical form; it reports whether the target is usable.
func (d declaration) checkTables() (targetOK bool) {
	c := d.c
	d.table("source", &c.Source)
	targetOK = d.table("target", &c.Target)
	if c.Through != nil && c.Through.Table != "" {
		th := *c.Through
		d.table("via.table", &th.Table)
		c.Through = &th
	}
	return targetOK
}

// table checks the table name *v of field sub and canonicalizes it.
func (d declaration) table(sub string, v *string) bool {
	if *v == "" {
		d.add(sub, "required")
		return false
	}
	schema, tbl, err := parseTable(*v)
	if err != nil {
		d.add(sub, "%v", err)
		return false
	}
	*v = CanonicalTable(schema, tbl)
	return true
}

// column checks a column name v of field sub.
func (d declaration) column(sub, v string, required bool) {
	switch {
	case v == "" && required:
		d.add(sub, "required")
	case v == "":
	case len(v) > MaxIdentLen:
		d.add(sub, "%q is longer than %d bytes", v, MaxIdentLen)
	case strings.ContainsRune(v, 0):
		d.add(sub, "contains a NUL byte")
	}
}

// checkKey checks the key, or the target_row of a keyless counter.
func (d declaration) checkKey() {
	c := d.c
	switch {
	case c.Keyless() && c.Key != "":
		d.add("key", "a counter with target_row has no key: every counted row counts into that one row")
	case c.Keyless() && strings.ContainsRune(c.TargetRow, 0):
		d.add("target_row", "contains a NUL byte")
	default:
		d.column("key", c.Key, !c.Keyless())
	}
}

// checkColumns checks the names of the target key, the counter column and
// the column summed or kept the extremum of.
func (d declaration) checkColumns() {
	c := d.c
	d.column("target_key", c.TargetKey, true)
	d.column("column", c.Column, true)
	d.column("sum", c.Sum, false)
	d.column("max", c.Max, false)
	d.column("min", c.Min, false)
}

// checkKind holds the counter to one kind: a count, a sum, a max or a min.
func (d declaration) checkKind() {
	c := d.c
	switch {
	case c.Max != "" && c.Min != "":
		d.add("min", "a counter keeps max or min, not both: declare two counters")
	case c.Sum != "" && (c.Max != "" || c.Min != ""):
		d.add("sum", "a counter keeps a sum or an extremum (max, min), not both: declare two counters")
	}
}

// checkWhere checks the where columns and each filter's operator and
// values.
func (d declaration) checkWhere() {
	c := d.c
	for k := range c.Where {
		d.column("where."+k, k, true)
	}
	for _, k := range sortedKeys(c.Filters) {
		d.column("where."+k, k, true)
		f := c.Filters[k]
		if _, dup := c.Where[k]; dup {
			d.add("where."+k, "column %q is listed twice", k)
		}
		switch f.Op {
		case OpNotNull:
			if len(f.Values) != 0 {
				d.add("where."+k, "IS NOT NULL takes no value")
			}
		case OpNe:
			if len(f.Values) != 1 {
				d.add("where."+k, "<> takes one value")
			}
		case OpIn, OpNotIn:
			if len(f.Values) == 0 {
				d.add("where."+k, "the list is empty: %s () matches no row", f.Op)
			}
		default:
			d.add("where."+k, "unknown operator %q", f.Op)
		}
	}
}

// checkDefaults checks create_missing's defaults: columns other than the
// key and the counter column, of a counter that creates rows.
func (d declaration) checkDefaults() {
	c := d.c
	for _, k := range sortedKeys(c.Defaults) {
		d.column("create_missing.defaults."+k, k, true)
		switch {
		case !c.CreateMissing:
			d.add("create_missing.defaults."+k, "defaults are for create_missing")
		case k == c.TargetKey:
			d.add("create_missing.defaults."+k, "%q is the target_key: a created row takes the key", k)
		case k == c.Column:
			d.add("create_missing.defaults."+k, "%q is the counter column: a created row's column starts at the key's delta", k)
		}
	}
}

// checkWritten holds the counter column to being no key and written by no
// other counter.
func (d declaration) checkWritten(targetOK bool) {
	c := d.c
	if !targetOK || c.Column == "" {
		return
	}
	if c.Column == c.TargetKey {
		d.add("column", "%q is also the target_key", c.Column)
	}
	w := c.Target + "." + c.Column
	if j, dup := d.v.written[w]; dup {
		d.add("column", "%s is already written by counters[%d] (%s): two counters cannot write one column", w, j, d.cs[j].Name)
	} else {
		d.v.written[w] = d.i
	}
}

// checkReadColumns holds each counter column to what other counters may
// read of it. A counter column may be summed by another counter (a
// multi-level counter: likes → posts.likes_count → users.total_likes):
// walcount's own flushes of the first are UPDATEs of the second's source,
// counted like the app's. It must not be a key or where column of a
// counted table (a count moving rows between keys or in and out of a
// filter at every flush), and the sums must not form a cycle (SumCycle): a
// counter whose column feeds, through any chain of sums, its own source
// column would chase its own tail through the WAL forever.
func (v *validator) checkReadColumns(cs []Counter) {
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
				v.ps = append(v.ps, Problem{
					Field: FieldPath(i, c.Name) + ".column",
					Msg:   fmt.Sprintf("%s.%s is read by counters[%d] (%s): a counter column cannot be a key, max, min or where column of a counted table (only a sum may read it)", c.Target, c.Column, j, d.Name),
				})
			}
		}
	}
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
