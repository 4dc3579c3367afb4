package counter

import (
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
)

// pgxIdent quotes a possibly qualified identifier.
func pgxIdent(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Through declares that a counter reaches its target through one parent
// row (one foreign-key hop): a vote carries post_id, and the total belongs
// to the post's creator_id. Table is the parent, Key the parent column the
// counter's Key references, Column the parent column naming the target
// row, and Where and Filters restrict the parents whose rows count (the
// post's own deleted and removed flags).
//
// ExpandThrough turns such a counter into four plain ones around a table
// of walcount's own, walcount.via_<name> (ViaTable), one row per parent:
//
//	parent_key  the parent's key
//	target      the parent's Column, kept as the sum of Column over the
//	            one parent row with that key (0 once it is deleted)
//	passes      the number of parent rows with that key that pass the
//	            parent's filter and have a target (1 or 0)
//	total       the count or sum of the source rows referencing the parent,
//	            or their max or min (NULL with none)
//
// total, target and passes are counters of the via table (RoleTotal,
// RoleTarget, RolePasses), kept from the source's and the parent's own
// WAL. The declared counter becomes the level above them: the sum of
// total over the via rows with passes = 1, keyed by target. It counts
// walcount's own flushes of the via table from the WAL, as any
// multi-level counter does, so a parent that moves to another target or
// leaves the filter moves its whole total in the flush that records the
// move, and nothing on the hot path queries the parent.
//
// A max or min through a parent has the same shape: total is then the
// extremum of the parent's source rows (a recompute from them, as any
// extremum counter's), and the level above is the extremum of total over
// the via rows with passes = 1 keyed by target, recomputed from the via
// table whenever a via row's total, target or passes changes (its old and
// its new target both), which walcount's own flushes of the via table
// show in the WAL.
type Through struct {
	// Counter is the name of the declared counter; Role says which of
	// the four this one is ("" for the declared one).
	Counter string `json:"counter"`
	Role    string `json:"role,omitempty"`
	Table   string `json:"table"`
	Key     string `json:"key"`
	Column  string `json:"column"`
	// Where and Filters are the parent's filter, as Counter's.
	Where   map[string]*string `json:"where,omitempty"`
	Filters map[string]Filter  `json:"filters,omitempty"`
}

// The roles of the counters a counter through a parent expands into.
const (
	RoleTotal  = "total"
	RoleTarget = "target"
	// RolePasses is named "where" so that it sorts after "target": the
	// flush applies the counters of one target in name order, and a new
	// parent's via row then gets its target before it passes (see
	// docs/design.md).
	RolePasses = "where"
)

// The columns of a via table.
const (
	ViaParentKey = "parent_key"
	ViaTarget    = "target"
	ViaPasses    = "passes"
	ViaTotal     = "total"
)

// ViaSchema is the schema of the via tables: walcount's own.
const ViaSchema = "walcount"

// viaSuffix is what the names of the generated counters add to the
// declared one's; MaxViaNameLen keeps them within MaxIdentLen.
const viaSuffix = "__via_"

// MaxViaNameLen is the longest name a counter through a parent may have:
// its generated counters' names add at most "__via_target".
const MaxViaNameLen = MaxIdentLen - len(viaSuffix+RoleTarget)

// ViaTable is the canonical name of the via table of the counter name.
func ViaTable(name string) string { return ViaSchema + ".via_" + name }

// ViaCounterName is the name of the generated counter of role of the
// counter through a parent name.
func ViaCounterName(name, role string) string { return name + viaSuffix + role }

// IsVia reports whether c is one of the three counters of a via table.
func (c Counter) IsVia() bool { return c.Through != nil && c.Through.Role != "" }

// expanded reports whether c is a declared counter through a parent that
// ExpandThrough has already turned into its level above the via table.
func (c Counter) expanded() bool {
	return c.Through != nil && c.Through.Role == "" && c.Source == ViaTable(c.Through.Counter)
}

// ExpandThrough returns cs with every counter through a parent replaced by
// the level above its via table, and the three counters of the via table
// appended after all the declared ones, in declaration order (so that the
// indexes of problems name the declared counters). Counters already
// expanded are left as they are.
func ExpandThrough(cs []Counter) []Counter {
	out := make([]Counter, 0, len(cs))
	var extra []Counter
	for _, c := range cs {
		if c.Through == nil || c.Through.Role != "" || c.expanded() {
			out = append(out, c)
			continue
		}
		th := *c.Through
		th.Counter = c.Name
		via := ViaTable(c.Name)
		gen := func(role string) *Through {
			t := th
			t.Role = role
			return &t
		}
		// The parent's filter, and a target to count into.
		where := maps.Clone(th.Where)
		filters := maps.Clone(th.Filters)
		if _, ok := where[th.Column]; !ok {
			if _, ok := filters[th.Column]; !ok {
				if filters == nil {
					filters = map[string]Filter{}
				}
				filters[th.Column] = Filter{Op: OpNotNull}
			}
		}
		extra = append(extra,
			Counter{Name: ViaCounterName(c.Name, RoleTotal), Source: c.Source, Key: c.Key,
				Target: via, TargetKey: ViaParentKey, Column: ViaTotal, Sum: c.Sum, Max: c.Max, Min: c.Min,
				Where: c.Where, Filters: c.Filters, AppendOnly: c.AppendOnly, CreateMissing: true, Through: gen(RoleTotal)},
			Counter{Name: ViaCounterName(c.Name, RoleTarget), Source: th.Table, Key: th.Key,
				Target: via, TargetKey: ViaParentKey, Column: ViaTarget, Sum: th.Column,
				CreateMissing: true, Through: gen(RoleTarget)},
			Counter{Name: ViaCounterName(c.Name, RolePasses), Source: th.Table, Key: th.Key,
				Target: via, TargetKey: ViaParentKey, Column: ViaPasses,
				Where: where, Filters: filters, CreateMissing: true, Through: gen(RolePasses)},
		)
		one := "1"
		top := c
		top.Through = &th
		top.Source, top.Key, top.Sum = via, ViaTarget, ViaTotal
		switch {
		case c.Max != "":
			top.Sum, top.Max = "", ViaTotal
		case c.Min != "":
			top.Sum, top.Min = "", ViaTotal
		}
		top.Where, top.Filters, top.AppendOnly = map[string]*string{ViaPasses: &one}, nil, false
		out = append(out, top)
	}
	return append(out, extra...)
}

// ThroughProblems checks what a counter through a parent declares beyond
// a plain counter's fields, before it is expanded: field is the counter's
// FieldPath. Only a counter without problems may be expanded.
func ThroughProblems(field string, c Counter) []Problem {
	th := c.Through
	if th == nil || th.Role != "" || c.expanded() {
		return nil
	}
	var ps []Problem
	add := func(sub, format string, args ...any) {
		ps = append(ps, Problem{Field: field + "." + sub, Msg: fmt.Sprintf(format, args...)})
	}
	if len(c.Name) > MaxViaNameLen {
		add("name", "a counter with via has a name of at most %d bytes (the counters of its via table add %q)", MaxViaNameLen, viaSuffix+RoleTarget)
	}
	if c.Keyless() {
		add("via", "a total with no key (target_row) reaches no parent")
	}
	if th.Table == "" {
		add("via.table", "required (the parent table)")
	}
	if th.Key == "" {
		add("via.key", "required (the parent column that key references)")
	}
	if th.Column == "" {
		add("via.column", "required (the parent column naming the target row)")
	}
	if _, ok := th.Where[th.Column]; ok && th.Column != "" {
		add("via.where."+th.Column, "via.column is filtered already: a parent with no target counts for none")
	}
	for _, t := range []string{c.Source, th.Table} {
		if s, _, err := parseTable(t); err == nil && s == ViaSchema {
			add("via", "the walcount schema is walcount's own: neither the source nor the parent can be in it")
			break
		}
	}
	return ps
}

// ViaTableSQL returns the statements that create the via table of the
// counter through a parent c (its level above the via table, or the
// declared counter), with a parent_key of the parent key's type and a
// total of the counter column's type, or do nothing when it exists. The
// table has REPLICA IDENTITY FULL (the level above it reads the old
// target, passes and total of every UPDATE) and an index on target (the
// level above reconciles by target). The total of a max or min
// (extremum) is NULL while the parent has no source row with a value,
// and the index is on (target, total): the level above's recompute of a
// target is one index probe.
func ViaTableSQL(name string, parentKey, column Column, extremum bool) []string {
	schema, table := SplitTable(ViaTable(name))
	ident := pgxIdent(schema, table)
	total, index := column.Full+" NOT NULL DEFAULT 0", ViaTarget
	if extremum {
		total, index = column.Full, ViaTarget+", "+ViaTotal
	}
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (%s %s PRIMARY KEY, %s bigint NOT NULL DEFAULT 0, %s bigint NOT NULL DEFAULT 0, %s %s)`,
			ident, ViaParentKey, parentKey.Full, ViaTarget, ViaPasses, ViaTotal, total),
		fmt.Sprintf(`ALTER TABLE %s REPLICA IDENTITY FULL`, ident),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (%s)`, pgxIdent(table+"_target"), ident, index),
	}
}

// ViaSeedSQL is the statement that gives every parent row a via row
// (zeros) when it has none: a reconciliation over every key of the via
// table's counters only measures the rows it has, so a full run of them
// (a backfill among them) seeds first. A zero row changes no count above
// it, and the stream's deltas for a parent seeded meanwhile add to it.
func ViaSeedSQL(c Counter) string {
	th := c.Through
	ps, pt := SplitTable(th.Table)
	vs, vt := SplitTable(ViaTable(th.Counter))
	key := pgxIdent(th.Key)
	return fmt.Sprintf(`INSERT INTO %[1]s (%[2]s) SELECT p.%[3]s FROM %[4]s AS p WHERE p.%[3]s IS NOT NULL AND NOT EXISTS (SELECT 1 FROM %[1]s AS v WHERE v.%[2]s = p.%[3]s) ON CONFLICT DO NOTHING`,
		pgxIdent(vs, vt), ViaParentKey, key, pgxIdent(ps, pt))
}

// ViaCollectSQL is the statement that deletes up to $1 via rows of the
// via table of c (its total counter, or the declared one: they say
// whether it is a max or min) that hold nothing any more: a parent
// deleted, with no source row left. Such a row is all zeros (target,
// passes and total; a max or min's total is NULL), no parent row has its
// key and
// no source row references it; the rows another transaction holds (a
// flush) are skipped, and a row a flush changed since the statement began
// is not deleted unless it is still all zeros. It returns the keys of the
// rows deleted. A zero row adds nothing above, and a via row is only ever
// the sum of the deltas for its key: the deltas on their way for a key
// whose row is deleted create it again (create_missing), so the
// aggregator does not treat a via row's delete as the end of a row (see
// aggregator's targetRule.via) and a parent re-created with the same key
// counts as before.
func ViaCollectSQL(c Counter) string {
	th := c.Through
	vs, vt := SplitTable(ViaTable(th.Counter))
	ps, pt := SplitTable(th.Table)
	via := pgxIdent(vs, vt)
	zero := fmt.Sprintf("v.%s = 0 AND v.%s = 0 AND v.%s = 0", ViaTarget, ViaPasses, ViaTotal)
	if ext, _ := c.Extremum(); ext != "" {
		zero = fmt.Sprintf("v.%s = 0 AND v.%s = 0 AND v.%s IS NULL", ViaTarget, ViaPasses, ViaTotal)
	}
	var source string
	if c.Through.Role == RoleTotal {
		ss, st := SplitTable(c.Source)
		source = fmt.Sprintf(" AND NOT EXISTS (SELECT 1 FROM %s AS s WHERE s.%s = v.%s)", pgxIdent(ss, st), pgxIdent(c.Key), ViaParentKey)
	}
	return fmt.Sprintf(`WITH c AS (SELECT v.%[1]s FROM %[2]s AS v WHERE %[3]s
  AND NOT EXISTS (SELECT 1 FROM %[4]s AS p WHERE p.%[5]s = v.%[1]s)%[6]s
  LIMIT $1 FOR UPDATE OF v SKIP LOCKED)
DELETE FROM %[2]s AS v USING c WHERE v.%[1]s = c.%[1]s AND %[3]s RETURNING v.%[1]s::text`,
		ViaParentKey, via, zero, pgxIdent(ps, pt), pgxIdent(th.Key), source)
}
