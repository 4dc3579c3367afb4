package counter

import (
	"encoding/json"
	"strings"
)

// Counter declares one counter cache: the rows of Source, grouped by Key,
// are counted (or their Sum column summed) into Target.Column of the row
// whose TargetKey equals the key. The configuration file's keys of a
// counter are app/config's (name, source, key, target, target_key, ...).
type Counter struct {
	// Name is unique among the counters; it is used in metrics, logs and
	// in walcount's Redis fields. It matches [a-z][a-z0-9_]*.
	Name string
	// Source is the table whose rows are counted, schema-qualified
	// ("public.likes"). An unqualified name means schema public.
	Source string
	// Key is the source column naming the target row.
	Key string
	// Target is the table holding the counter column.
	Target string
	// TargetKey is the target column matched against Key.
	TargetKey string
	// Column is the target column that holds the count.
	Column string
	// Sum, when set, names a numeric source column whose values are summed
	// instead of counting rows.
	Sum string
	// Where restricts the counted rows: every listed source column must
	// equal the given value. A nil value means IS NULL.
	Where map[string]*string
	// Filters restricts the counted rows further with conditions beyond
	// equality: IS NOT NULL, <>, IN and NOT IN (see Filter). A column is
	// in Where or in Filters, not both. It is omitted from the recorded
	// definition when empty, so that counters without it keep theirs.
	Filters map[string]Filter `json:",omitempty"`
	// TargetRow, when set, makes a total with no key: Key is empty and
	// every counted source row counts into the one target row whose
	// TargetKey is TargetRow (a site-wide row), written as PostgreSQL
	// prints the value.
	TargetRow string `json:",omitempty"`
	// AppendOnly declares that the source takes only INSERTs (an event
	// log): its replica identity need not carry the columns the counter
	// reads, and an UPDATE or DELETE that reaches the stream anyway marks
	// the counter dirty instead of being counted.
	AppendOnly bool `json:",omitempty"`
	// CreateMissing makes the flush create the target row of a key that
	// has none (INSERT ... ON CONFLICT (target_key) DO UPDATE): the
	// created row's column starts at the key's delta, TargetKey holds the
	// key, and Defaults gives the other columns their values. It is left
	// out of the recorded definition: it changes no count of an existing
	// row, so turning it on or off needs no backfill.
	CreateMissing bool `json:"-"`
	// Defaults maps target columns to the values a created row gets (as
	// text, cast to the column's type on the server); the columns it does
	// not name get their declared DEFAULT or NULL.
	Defaults map[string]string `json:"-"`
	// Max and Min, when one is set, name a source column whose greatest
	// (least) value over the counted rows of each key is kept in Column,
	// NULL when there is none (an extremum). They are omitted from the
	// recorded definition when empty.
	Max string `json:",omitempty"`
	Min string `json:",omitempty"`
	// Through, when set, makes the counter reach its target through one
	// parent row (see Through and ExpandThrough). It is in the recorded
	// definition, so that a change of the parent's filter or of the
	// column naming the target backfills the counters it changes.
	Through *Through `json:",omitempty"`
}

// Extremum returns the source column an extremum counter keeps the
// greatest or least value of, and the aggregate that computes it ("max" or
// "min"); both are empty for counts and sums.
func (c Counter) Extremum() (column, fn string) {
	switch {
	case c.Max != "":
		return c.Max, "max"
	case c.Min != "":
		return c.Min, "min"
	}
	return "", ""
}

// Keyless reports whether c is a total with no key (TargetRow).
func (c Counter) Keyless() bool { return c.TargetRow != "" }

// Default is the counter that applies when no configuration names any:
// the number of likes rows of each post, in posts.likes_count.
func Default() Counter {
	return Counter{
		Name:      "post_likes",
		Source:    "public.likes",
		Key:       "post_id",
		Target:    "public.posts",
		TargetKey: "id",
		Column:    "likes_count",
	}
}

// SourceTable returns the schema and table of c.Source.
func (c Counter) SourceTable() (schema, table string) { return SplitTable(c.Source) }

// TargetTable returns the schema and table of c.Target.
func (c Counter) TargetTable() (schema, table string) { return SplitTable(c.Target) }

// ReadColumns returns the source columns c reads from a row: the key, the
// summed column and the filter columns, in that order without repeats.
// They must all be in the source's replica identity for old rows to be
// attributable.
func (c Counter) ReadColumns() []string {
	var cols []string
	if c.Key != "" {
		cols = append(cols, c.Key)
	}
	add := func(s string) {
		for _, have := range cols {
			if have == s {
				return
			}
		}
		cols = append(cols, s)
	}
	if c.Sum != "" {
		add(c.Sum)
	}
	if v, _ := c.Extremum(); v != "" {
		add(v)
	}
	for _, w := range c.FilterColumns() {
		add(w)
	}
	return cols
}

// Delta is one coalesced change of a counter key: N is added to the field
// "counter:key" (see Field).
type Delta struct {
	Field string
	N     int64
}

// Move changes deltas already buffered, before later ones are added: the
// delta of Field moves to To, or is dropped when To is empty. The
// aggregator uses it when a target row is deleted or changes its key.
type Move struct {
	Field, To string
}

// Field is the buffer field of a counter's key.
func Field(counter, key string) string { return counter + ":" + key }

// SplitField splits a buffer field into counter and key. Counter names
// cannot contain ':', keys may.
func SplitField(f string) (counter, key string, ok bool) {
	return strings.Cut(f, ":")
}

// Definition is c as walcount.counters records it for a backfill: two
// counters with the same definition count the same thing.
func (c Counter) Definition() string {
	b, _ := json.Marshal(c)
	return string(b)
}
