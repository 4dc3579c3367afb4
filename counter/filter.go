package counter

import "slices"

// Filter operators. Equality and IS NULL are Counter.Where's; the others
// are Counter.Filters'.
const (
	OpEq      = "="
	OpIsNull  = "IS NULL"
	OpNotNull = "IS NOT NULL"
	OpNe      = "<>"
	OpIn      = "IN"
	OpNotIn   = "NOT IN"
)

// Filter is a where condition beyond equality and IS NULL: IS NOT NULL,
// <> a value, IN a list of values or NOT IN a list. Values are the
// configured literals (never NULL). As in SQL, a NULL column passes none
// of <>, IN and NOT IN.
type Filter struct {
	Op     string   `json:"op"`
	Values []string `json:"values,omitempty"`
}

// Cond is one condition of a counter's filter, whichever map it came from.
type Cond struct {
	Column string
	Op     string
	Values []string // one for = and <>, the list for IN and NOT IN
}

// Conds returns every condition of c's filter, by column name.
func (c Counter) Conds() []Cond {
	var out []Cond
	for _, name := range sortedKeys(c.Where) {
		if v := c.Where[name]; v == nil {
			out = append(out, Cond{Column: name, Op: OpIsNull})
		} else {
			out = append(out, Cond{Column: name, Op: OpEq, Values: []string{*v}})
		}
	}
	for _, name := range sortedKeys(c.Filters) {
		f := c.Filters[name]
		out = append(out, Cond{Column: name, Op: f.Op, Values: slices.Clone(f.Values)})
	}
	slices.SortStableFunc(out, func(a, b Cond) int {
		switch {
		case a.Column < b.Column:
			return -1
		case a.Column > b.Column:
			return 1
		}
		return 0
	})
	return out
}

// FilterColumns returns the columns c's filter reads, sorted, without
// repeats.
func (c Counter) FilterColumns() []string {
	var out []string
	for _, cd := range c.Conds() {
		if !slices.Contains(out, cd.Column) {
			out = append(out, cd.Column)
		}
	}
	return out
}

// Matches reports whether a column's value passes the condition: null is
// true for a NULL value, text is the value as pgoutput sends it, and the
// condition's values are in the same form (CanonicalValue).
func (cd Cond) Matches(null bool, text string) bool {
	switch cd.Op {
	case OpIsNull:
		return null
	case OpNotNull:
		return !null
	case OpEq:
		return !null && text == cd.Values[0]
	case OpNe:
		return !null && text != cd.Values[0]
	case OpIn:
		return !null && slices.Contains(cd.Values, text)
	case OpNotIn:
		return !null && !slices.Contains(cd.Values, text)
	}
	return false
}
