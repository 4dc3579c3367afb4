package counter

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// buildSQL writes r's statements. Identifiers are quoted with
// pgx.Identifier, never spliced; type names come from format_type, which
// quotes what needs quoting. Keys travel as text and are cast to the key
// column's type on the server.
func (r *Resolved) buildSQL(src, tgt *Table, key, tkey Column) error {
	c := r.Counter
	col := pgx.Identifier{c.Column}.Sanitize()
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	keyID := pgx.Identifier{c.Key}.Sanitize()

	// The flush statement (design rule 2): one round trip per chunk of
	// keys. It first locks the chunk's target rows it can lock at once, in
	// key order (FOR NO KEY UPDATE, which a foreign key's KEY SHARE lock
	// does not conflict with), skipping rows another transaction holds,
	// then updates only those, so it never waits for a row lock. It
	// returns the keys it did not update, each with whether a row has the
	// key in its snapshot (present: its row was locked by another
	// transaction, and its delta is carried to the next flush) and whether
	// the statement locked it (a locked row not updated: a BEFORE UPDATE
	// trigger skipped it). A key without a row hit none: only the
	// statement knows, because a row deleted (or re-keyed) and inserted
	// again while the app held its lock is not the row the delta was
	// counted for (design rule 17).
	r.Flush = fmt.Sprintf(`WITH d AS (SELECT u.k, u.k::%[1]s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)),
l AS (SELECT t.%[6]s AS id FROM %[2]s AS t WHERE t.%[6]s IN (SELECT d.id FROM d) ORDER BY t.%[6]s FOR NO KEY UPDATE OF t SKIP LOCKED),
hit AS (UPDATE %[2]s AS t SET %[3]s = t.%[4]s + %[5]s FROM d WHERE t.%[6]s = d.id AND t.%[6]s IN (SELECT l.id FROM l) RETURNING d.k)
SELECT d.k, EXISTS (SELECT 1 FROM %[2]s AS t WHERE t.%[6]s = d.id), d.id IN (SELECT l.id FROM l)
FROM d WHERE d.k NOT IN (SELECT hit.k FROM hit)`, tkey.Full, tgt.Ident(), col, col, deltaExpr(r.Scale), tkeyID)

	if c.CreateMissing {
		r.Flush = createFlush(r, tgt, tkey)
	}
	r.Correct = fmt.Sprintf(`WITH d AS (SELECT u.k, u.k::%[1]s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)),
hit AS (UPDATE %[2]s AS t SET %[3]s = t.%[3]s + %[4]s FROM d WHERE t.%[5]s = d.id RETURNING d.k)
SELECT d.k FROM d WHERE d.k NOT IN (SELECT hit.k FROM hit)`, tkey.Full, tgt.Ident(), col, deltaExpr(r.Scale), tkeyID)

	value := "count(*)"
	if c.Sum != "" {
		sumID := pgx.Identifier{c.Sum}.Sanitize()
		value = fmt.Sprintf("coalesce(sum(s.%s), 0)", sumID)
		if src.Columns[c.Sum].BaseOID == pgtype.BoolOID {
			// A boolean counts +1 when true and -1 when false (a vote).
			value = fmt.Sprintf("coalesce(sum(CASE WHEN s.%[1]s THEN 1 WHEN NOT s.%[1]s THEN -1 END), 0)", sumID)
		}
	}
	scaled := func(expr string) string {
		if r.Scale == 0 {
			return fmt.Sprintf("(%s)::bigint", expr)
		}
		return fmt.Sprintf("round((%s) * 1e%d)::bigint", expr, r.Scale)
	}
	filterAfter, err := r.whereFilters(src)
	if err != nil {
		return err
	}
	filter := filterAfter(1)
	// measured is the bigint a measurement compares: the count or sum in
	// delta units, or for an extremum a hash of its text in the counter
	// column's type (0 for NULL, no value), which the cached column is
	// hashed to alike.
	measured := scaled(value)
	ext, fn := c.Extremum()
	if ext != "" {
		r.Extremum = true
		measured = fmt.Sprintf("coalesce(hashtextextended(CAST(%s(s.%s) AS %s)::text, 0), 0)", fn, pgx.Identifier{ext}.Sanitize(), tgt.Columns[c.Column].Full)
	}
	// onlyRow restricts target rows t to the one a total with no key is
	// kept in; nothing for a keyed counter.
	onlyRow := ""
	if c.Keyless() {
		onlyRow = fmt.Sprintf(" AND t.%s = CAST(%s AS %s)", tkeyID, quoteLiteral(c.TargetRow), tkey.Full)
	}
	r.Scan = fmt.Sprintf(`SELECT t.%s::text FROM %s t WHERE ($1::text IS NULL OR t.%s > CAST($1::text AS %s))%s ORDER BY t.%s LIMIT $2`,
		tkeyID, tgt.Ident(), tkeyID, tkey.Full, onlyRow, tkeyID)
	if c.Keyless() {
		// Every filtered source row counts into the one key.
		r.Truth = fmt.Sprintf(`SELECT r.k, r.v FROM (SELECT %s::text AS k, %s AS v FROM %s s WHERE true%s) r WHERE r.k = ANY ($1::text[])`,
			quoteLiteral(c.TargetRow), measured, src.Ident(), filter)
	} else {
		r.Truth = fmt.Sprintf(`SELECT s.%s::text, %s FROM %s s WHERE s.%s = ANY (CAST($1::text[] AS %s[]))%s GROUP BY s.%s`,
			keyID, measured, src.Ident(), keyID, key.Full, filter, keyID)
	}
	r.buildFill(src, tgt, key, tkey, value, filterAfter(1), onlyRow)
	// The cached value counts the deltas the flushes carried (design
	// rule 2): the column and walcount.carried together hold every
	// transaction up to W.
	carried := func(param int) string {
		return fmt.Sprintf(" LEFT JOIN walcount.carried wc ON wc.slot_name = $%d AND wc.counter = '%s' AND wc.key = t.%s::text",
			param, strings.ReplaceAll(c.Name, "'", "''"), tkeyID)
	}
	cached := scaled("coalesce(t."+col+", 0)") + " + coalesce(wc.delta, 0)"
	if r.Extremum {
		// A carried delta of an extremum is a recompute to come, not a
		// part of the value: the column is measured as it is, and a key
		// with one is not measured at all (NULL: the survey finds it not
		// off, a read of the key finds no column), since the recompute
		// sets its column whatever it holds now.
		cached = "CASE WHEN coalesce(wc.delta, 0) = 0 THEN coalesce(hashtextextended(t." + col + "::text, 0), 0) END"
	}
	r.Column = fmt.Sprintf(`SELECT t.%s::text, %s FROM %s t%s WHERE t.%s = ANY (CAST($1::text[] AS %s[]))`,
		tkeyID, cached, tgt.Ident(), carried(2), tkeyID, tkey.Full)
	r.Total = fmt.Sprintf(`SELECT count(*) FROM %s t WHERE true%s`, tgt.Ident(), onlyRow)
	r.buildRead(src, tgt, key, tkey, scaled, filterAfter(2), onlyRow)
	// The TRUNCATE reset (design rule 10) never waits for a row lock
	// either: it zeroes the rows it can lock at once and returns, for each
	// row another transaction holds, its key and its column in delta units
	// (as the statement's snapshot saw it: only walcount writes the column),
	// whose opposite the flush carries.
	r.Reset = fmt.Sprintf(`WITH l AS (SELECT t.%[1]s AS k FROM %[2]s AS t WHERE t.%[3]s IS DISTINCT FROM 0%[5]s FOR NO KEY UPDATE OF t SKIP LOCKED),
u AS (UPDATE %[2]s AS t SET %[3]s = 0 WHERE t.%[1]s IN (SELECT l.k FROM l) RETURNING t.%[1]s AS k)
SELECT t.%[1]s::text, %[4]s FROM %[2]s AS t WHERE t.%[3]s <> 0%[5]s AND t.%[1]s NOT IN (SELECT u.k FROM u)`,
		tkeyID, tgt.Ident(), col, scaled("t."+col), onlyRow)
	if c.CreateMissing && !c.IsVia() {
		r.buildSeed(src, tgt, tkey, filterAfter(0))
	}
	if r.Extremum {
		r.buildExtremumSQL(src, tgt, key, tkey, fn, ext, filterAfter(2), onlyRow)
	}
	if c.Keyless() {
		r.buildKeylessSurvey(tgt, tkey, measured, cached, carried(3+len(r.FilterArgs)), filterAfter(2), src, onlyRow)
		return nil
	}
	r.buildSurvey(src, tgt, key, tkey, measured, cached, carried(3+len(r.FilterArgs)), filterAfter(2))
	return nil
}

// buildRead writes Read: the checkpoint, the target row, the carried
// delta and the dirty marks of the keys, all in one statement so in one
// snapshot (docs/design.md §7). A counter not backfilled with its
// definition (new, changed, or its backfill under way) reads as dirty: its
// column does not hold the rows older than walcount's slot yet.
func (r *Resolved) buildRead(src, tgt *Table, key, tkey Column, scaled func(string) string, filter, onlyRow string) {
	c := r.Counter
	col := pgx.Identifier{c.Column}.Sanitize()
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	name := quoteLiteral(c.Name)
	column := scaled("coalesce(t."+col+", 0)") + "::text"
	now := "NULL::text"
	if r.Extremum {
		ext, fn := c.Extremum()
		column = "t." + col + "::text"
		match := "true"
		if !c.Keyless() {
			match = fmt.Sprintf("s.%s = CAST(k.k AS %s)", pgx.Identifier{c.Key}.Sanitize(), key.Full)
		}
		now = fmt.Sprintf("CAST((SELECT %s(s.%s) FROM %s AS s WHERE %s%s) AS %s)::text",
			fn, pgx.Identifier{ext}.Sanitize(), src.Ident(), match, filter, tgt.Columns[c.Column].Full)
	}
	r.Read = fmt.Sprintf(`SELECT (SELECT c.lsn::text FROM walcount.checkpoint c WHERE c.slot_name = $2),
t.%[1]s IS NOT NULL, %[2]s, coalesce(wc.delta, 0),
EXISTS (SELECT 1 FROM walcount.dirty dm WHERE dm.slot_name = $2 AND dm.counter = %[3]s AND (dm.key IS NULL OR dm.key = k.k))
OR NOT EXISTS (SELECT 1 FROM walcount.counters bc WHERE bc.slot_name = $2 AND bc.name = %[3]s AND bc.backfilled_at IS NOT NULL AND bc.definition = %[8]s),
%[4]s
FROM unnest($1::text[]) WITH ORDINALITY AS k(k, i)
LEFT JOIN %[5]s AS t ON t.%[1]s = CAST(k.k AS %[6]s)%[7]s
LEFT JOIN walcount.carried wc ON wc.slot_name = $2 AND wc.counter = %[3]s AND wc.key = k.k
ORDER BY k.i`, tkeyID, column, name, now, tgt.Ident(), tkey.Full, onlyRow, quoteLiteral(c.Definition()))
}

// whereFilters sets r.FilterArgs to the values of c's where conditions
// and returns the function that writes the conditions on source rows s,
// their values bound after a statement's first n parameters.
func (r *Resolved) whereFilters(src *Table) (func(n int) string, error) {
	c := r.Counter
	r.FilterArgs = nil
	type cond struct{ sql, typ string }
	var conds []cond
	for _, cd := range c.Conds() {
		id := "s." + pgx.Identifier{cd.Column}.Sanitize()
		wcol, ok := src.Columns[cd.Column]
		if !ok {
			return nil, fmt.Errorf("counter %s: %w: where column %s.%s does not exist", c.Name, ErrBadTarget, src.Ident(), pgx.Identifier{cd.Column}.Sanitize())
		}
		switch cd.Op {
		case OpIsNull, OpNotNull:
			conds = append(conds, cond{sql: id + " " + cd.Op})
		case OpEq, OpNe:
			r.FilterArgs = append(r.FilterArgs, cd.Values[0])
			conds = append(conds, cond{sql: id + " " + cd.Op + " CAST($%d::text AS %s)", typ: wcol.Full})
		case OpIn:
			r.FilterArgs = append(r.FilterArgs, cd.Values)
			conds = append(conds, cond{sql: id + " = ANY (CAST($%d::text[] AS %s[]))", typ: wcol.Full})
		case OpNotIn:
			r.FilterArgs = append(r.FilterArgs, cd.Values)
			conds = append(conds, cond{sql: id + " <> ALL (CAST($%d::text[] AS %s[]))", typ: wcol.Full})
		default:
			return nil, fmt.Errorf("counter %s: where column %s: unknown operator %q", c.Name, cd.Column, cd.Op)
		}
	}
	return func(n int) string {
		var b strings.Builder
		for _, w := range conds {
			if w.typ == "" {
				b.WriteString(" AND " + w.sql)
				continue
			}
			n++
			b.WriteString(" AND " + fmt.Sprintf(w.sql, n, w.typ))
		}
		return b.String()
	}, nil
}

// buildExtremumSQL writes the flush and reset statements of a max or min
// counter. Its deltas only say that a key's rows changed: the flush sets
// the column of each key it can lock from the source rows its statement's
// snapshot sees (one index-backed max or min per key, NULL when the key has
// none), with the same locking, returned keys and parameters as the flush
// of a count, and the filter values bound after them (FlushArgs). The
// snapshot sees every transaction the batch holds, and a change committed
// after it is in a later batch, which sets the column again: idempotent, so
// nothing needs to be applied exactly once. The reset (a TRUNCATE of the
// source) sets the column to NULL, and returns each row another
// transaction holds with -1, whose opposite the flush carries: a
// recompute.
func (r *Resolved) buildExtremumSQL(src, tgt *Table, key, tkey Column, fn, ext, filter, onlyRow string) {
	c := r.Counter
	col := pgx.Identifier{c.Column}.Sanitize()
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	match := "true"
	if !c.Keyless() {
		match = fmt.Sprintf("s.%s = CAST(d.k AS %s)", pgx.Identifier{c.Key}.Sanitize(), key.Full)
	}
	r.FlushArgs = r.FilterArgs
	r.Flush = fmt.Sprintf(`WITH d AS (SELECT u.k, u.k::%[1]s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)),
l AS (SELECT t.%[4]s AS id FROM %[2]s AS t WHERE t.%[4]s IN (SELECT d.id FROM d) ORDER BY t.%[4]s FOR NO KEY UPDATE OF t SKIP LOCKED),
hit AS (UPDATE %[2]s AS t SET %[3]s = (SELECT %[5]s(s.%[6]s) FROM %[7]s AS s WHERE %[8]s%[9]s) FROM d WHERE t.%[4]s = d.id AND t.%[4]s IN (SELECT l.id FROM l) RETURNING d.k)
SELECT d.k, EXISTS (SELECT 1 FROM %[2]s AS t WHERE t.%[4]s = d.id), d.id IN (SELECT l.id FROM l)
FROM d WHERE d.k NOT IN (SELECT hit.k FROM hit)`, tkey.Full, tgt.Ident(), col, tkeyID, fn, pgx.Identifier{ext}.Sanitize(), src.Ident(), match, filter)
	if c.CreateMissing {
		r.Flush = createExtremumFlush(r, tgt, tkey, fmt.Sprintf("SELECT %s(s.%s) FROM %s AS s WHERE %s%s", fn, pgx.Identifier{ext}.Sanitize(), src.Ident(), match, filter))
	}
	// A correction of an extremum is a recompute too (its deltas are
	// +1s): Correct sets the column of the rows with the keys $1 from
	// their source rows, whatever $2 holds, the filter values bound after
	// $2 (FlushArgs), and returns the keys with no row. A via table's
	// quiet corrections (reconcile's correctVia) write it so.
	r.Correct = fmt.Sprintf(`WITH d AS (SELECT u.k, u.k::%[1]s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)),
hit AS (UPDATE %[2]s AS t SET %[3]s = (SELECT %[5]s(s.%[6]s) FROM %[7]s AS s WHERE %[8]s%[9]s) FROM d WHERE t.%[4]s = d.id RETURNING d.k)
SELECT d.k FROM d WHERE d.k NOT IN (SELECT hit.k FROM hit)`, tkey.Full, tgt.Ident(), col, tkeyID, fn, pgx.Identifier{ext}.Sanitize(), src.Ident(), match, filter)
	r.Reset = fmt.Sprintf(`WITH l AS (SELECT t.%[1]s AS k FROM %[2]s AS t WHERE t.%[3]s IS NOT NULL%[4]s FOR NO KEY UPDATE OF t SKIP LOCKED),
u AS (UPDATE %[2]s AS t SET %[3]s = NULL WHERE t.%[1]s IN (SELECT l.k FROM l) RETURNING t.%[1]s AS k)
SELECT t.%[1]s::text, -1::bigint FROM %[2]s AS t WHERE t.%[3]s IS NOT NULL%[4]s AND t.%[1]s NOT IN (SELECT u.k FROM u)`,
		tkeyID, tgt.Ident(), col, onlyRow)
}

// buildSurvey writes the statements of reconcile's survey, which measures
// a whole range of target keys in one snapshot: Compare joins the target
// rows of the range ($1, $2: its first and last key) with the true value
// of each, one aggregate over the source rows of the range, and returns
// only the keys whose column differs. The range's bounds are parameters,
// so the planner estimates the range from the statistics: with an index
// whose leading column is the source key, the source rows of a range are
// one ordered index-only scan.
//
// Integer keys (SurveyIntKeys) are compared as numbers and ranges are
// ranges of values: SurveyFirst finds the first key, SurveyNext the first
// key after $1, and SurveyBounds the last key of the range of $2 keys from
// $1, for where keys are sparse. Compare returns the range's size, its last
// key and the keys that differ with their column and true value, as arrays.
// Bounds are bigint whatever the integer widths of the two keys: PostgreSQL
// compares integers of any widths through the same index, and a domain over
// an integer compares as its base type.
//
// Other key types use counted ranges: SurveyBounds is the range of $2 keys
// after $1 (NULL for the start) in the target key's order and returns its
// first and last key and its size; Compare looks the range's source rows up
// by its keys (= ANY), so that the result never depends on how two types or
// collations order values, and returns one row per key that differs.
func (r *Resolved) buildSurvey(src, tgt *Table, key, tkey Column, value, column, carried, filter string) {
	keyID := pgx.Identifier{r.Counter.Key}.Sanitize()
	tkeyID := pgx.Identifier{r.Counter.TargetKey}.Sanitize()
	r.SurveyIntKeys = key.IntegerBase() && tkey.IntegerBase()
	if r.SurveyIntKeys {
		r.SurveyFirst = fmt.Sprintf(`SELECT min(t.%s)::bigint FROM %s t`, tkeyID, tgt.Ident())
		r.SurveyNext = fmt.Sprintf(`SELECT min(t.%[1]s)::bigint FROM %[2]s t WHERE t.%[1]s > $1::bigint`, tkeyID, tgt.Ident())
		r.SurveyBounds = fmt.Sprintf(`SELECT max(r.k)::bigint FROM (SELECT t.%[1]s AS k FROM %[2]s t WHERE t.%[1]s >= $1::bigint ORDER BY t.%[1]s LIMIT $2) r`,
			tkeyID, tgt.Ident())
		off := "t.v <> coalesce(s.v, 0)"
		r.SurveyCompare = fmt.Sprintf(`SELECT count(*), max(t.k)::text,
  array_agg(t.k::text) FILTER (WHERE %[7]s), array_agg(t.v) FILTER (WHERE %[7]s), array_agg(coalesce(s.v, 0)) FILTER (WHERE %[7]s)
FROM (SELECT t.%[1]s AS k, %[2]s AS v FROM %[3]s t%[9]s WHERE t.%[1]s BETWEEN $1::bigint AND $2::bigint) t
LEFT JOIN (SELECT s.%[4]s AS k, %[5]s AS v FROM %[6]s s
  WHERE s.%[4]s BETWEEN $1::bigint AND $2::bigint%[8]s GROUP BY s.%[4]s) s ON s.k = t.k`,
			tkeyID, column, tgt.Ident(), keyID, value, src.Ident(), off, filter, carried)
		return
	}
	r.SurveyBounds = fmt.Sprintf(`SELECT min(r.k)::text, max(r.k)::text, count(*) FROM (
  SELECT t.%[1]s AS k FROM %[2]s t
  WHERE t.%[1]s IS NOT NULL AND ($1::text IS NULL OR t.%[1]s > CAST($1::text AS %[3]s))
  ORDER BY t.%[1]s LIMIT $2) r`, tkeyID, tgt.Ident(), tkey.Full)
	lo, hi := fmt.Sprintf("CAST($1::text AS %s)", tkey.Full), fmt.Sprintf("CAST($2::text AS %s)", tkey.Full)
	r.SurveyCompare = fmt.Sprintf(`WITH t AS MATERIALIZED (
  SELECT t.%[1]s AS k, %[2]s AS v FROM %[3]s t%[11]s WHERE t.%[1]s >= %[7]s AND t.%[1]s <= %[8]s)
SELECT t.k::text, t.v, coalesce(s.v, 0) FROM t LEFT JOIN (
  SELECT s.%[4]s::text AS k, %[5]s AS v FROM %[6]s s
  WHERE s.%[4]s = ANY (CAST((SELECT array_agg(t.k::text) FROM t) AS %[10]s[]))%[9]s GROUP BY s.%[4]s) s ON s.k = t.k::text
WHERE t.v <> coalesce(s.v, 0)`,
		tkeyID, column, tgt.Ident(), keyID, value, src.Ident(), lo, hi, filter, key.Full, carried)
}

// buildKeylessSurvey writes the survey of a total with no key: counted
// ranges of the target key (SurveyIntKeys false) restricted to the one
// row, and a Compare that sets that row's column against the aggregate of
// every filtered source row, with the parameters of buildSurvey's.
func (r *Resolved) buildKeylessSurvey(tgt *Table, tkey Column, value, column, carried, filter string, src *Table, onlyRow string) {
	tkeyID := pgx.Identifier{r.Counter.TargetKey}.Sanitize()
	r.SurveyIntKeys = false
	r.SurveyBounds = fmt.Sprintf(`SELECT min(r.k)::text, max(r.k)::text, count(*) FROM (
  SELECT t.%[1]s AS k FROM %[2]s t
  WHERE t.%[1]s IS NOT NULL AND ($1::text IS NULL OR t.%[1]s > CAST($1::text AS %[3]s))%[4]s
  ORDER BY t.%[1]s LIMIT $2) r`, tkeyID, tgt.Ident(), tkey.Full, onlyRow)
	lo, hi := fmt.Sprintf("CAST($1::text AS %s)", tkey.Full), fmt.Sprintf("CAST($2::text AS %s)", tkey.Full)
	r.SurveyCompare = fmt.Sprintf(`WITH t AS MATERIALIZED (
  SELECT t.%[1]s AS k, %[2]s AS v FROM %[3]s t%[4]s WHERE t.%[1]s >= %[5]s AND t.%[1]s <= %[6]s%[7]s)
SELECT t.k::text, t.v, s.v FROM t CROSS JOIN (SELECT %[8]s AS v FROM %[9]s s WHERE true%[10]s) s
WHERE t.v <> s.v`, tkeyID, column, tgt.Ident(), carried, lo, hi, onlyRow, value, src.Ident(), filter)
}

// quoteLiteral writes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// deltaExpr is the SQL value a buffered delta adds to the column. A delta
// of a numeric(p,s) sum counts units of 10^-s, so it is divided by 10^s.
// The division is written as a product with the exact literal 10^-s
// (0.01 for s = 2): numeric multiplication is exact and its result has
// scale s, where numeric division would pad the quotient to at least 16
// fractional digits and leave an unconstrained numeric column showing
// 12.50000000000000000000.
func deltaExpr(scale int) string {
	if scale == 0 {
		return "d.delta"
	}
	return "d.delta * 0." + strings.Repeat("0", scale-1) + "1"
}

// createFlush writes the flush statement of a create_missing counter: the
// statement of buildSQL, which updates the rows it can lock at once and
// never waits for a row lock, and then, for the keys that have no row in
// its snapshot, an INSERT of the row with the key, the delta in the column
// and the declared defaults, ON CONFLICT (target key) DO UPDATE adding the
// delta: a row another transaction committed since the snapshot gets the
// delta, and one it is inserting still is waited for (a wait that
// lock_timeout bounds, as for a table lock: the flush is tried again). It
// returns the keys it did not update as buildSQL's does, with a fourth
// column false, and then each key whose row it created, with true there
// (xmax = 0: the row version is the insert's own, not a conflict's update).
func createFlush(r *Resolved, tgt *Table, tkey Column) string {
	c := r.Counter
	col := pgx.Identifier{c.Column}.Sanitize()
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	cols := []string{tkeyID, col}
	vals := []string{"d.id", deltaExpr(r.Scale)}
	for _, name := range sortedKeys(c.Defaults) {
		cols = append(cols, pgx.Identifier{name}.Sanitize())
		vals = append(vals, fmt.Sprintf("CAST(%s AS %s)", quoteLiteral(c.Defaults[name]), tgt.Columns[name].Full))
	}
	return fmt.Sprintf(`WITH d AS (SELECT u.k, u.k::%[1]s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)),
l AS (SELECT t.%[5]s AS id FROM %[2]s AS t WHERE t.%[5]s IN (SELECT d.id FROM d) ORDER BY t.%[5]s FOR NO KEY UPDATE OF t SKIP LOCKED),
hit AS (UPDATE %[2]s AS t SET %[3]s = t.%[3]s + %[4]s FROM d WHERE t.%[5]s = d.id AND t.%[5]s IN (SELECT l.id FROM l) RETURNING d.k),
ins AS (INSERT INTO %[2]s AS t (%[6]s) SELECT %[7]s FROM d WHERE NOT EXISTS (SELECT 1 FROM %[2]s AS t WHERE t.%[5]s = d.id) ORDER BY d.id
  ON CONFLICT (%[5]s) DO UPDATE SET %[3]s = t.%[3]s + excluded.%[3]s RETURNING t.%[5]s AS id, t.xmax = 0 AS created)
SELECT d.k, EXISTS (SELECT 1 FROM %[2]s AS t WHERE t.%[5]s = d.id), d.id IN (SELECT l.id FROM l), false
FROM d WHERE d.k NOT IN (SELECT hit.k FROM hit) AND d.id NOT IN (SELECT ins.id FROM ins)
UNION ALL
SELECT d.k, false, false, true FROM d JOIN ins ON ins.id = d.id WHERE ins.created`,
		tkey.Full, tgt.Ident(), col, deltaExpr(r.Scale), tkeyID, strings.Join(cols, ", "), strings.Join(vals, ", "))
}

// createExtremumFlush writes the flush statement of a create_missing max
// or min counter: buildExtremumSQL's, which sets the column of each key
// it can lock at once from the source rows its snapshot sees, and then,
// for the keys with no row in its snapshot whose source rows have a value
// (value, the key's max or min over its rows d.k, is not NULL), an
// INSERT of the row with that value and the declared defaults, ON
// CONFLICT (target key) DO UPDATE setting the same value: a row the app
// committed since the snapshot gets the value the snapshot sees, and any
// change after the snapshot is in a later batch, which computes it again.
// A key with neither a row nor a value creates nothing (its rows are all
// gone, or have no value: a created row would hold NULL, which it holds
// without one). It returns what createFlush returns.
func createExtremumFlush(r *Resolved, tgt *Table, tkey Column, value string) string {
	c := r.Counter
	col := pgx.Identifier{c.Column}.Sanitize()
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	cols := []string{tkeyID, col}
	vals := []string{"d.id", "m.v"}
	for _, name := range sortedKeys(c.Defaults) {
		cols = append(cols, pgx.Identifier{name}.Sanitize())
		vals = append(vals, fmt.Sprintf("CAST(%s AS %s)", quoteLiteral(c.Defaults[name]), tgt.Columns[name].Full))
	}
	return fmt.Sprintf(`WITH d AS (SELECT u.k, u.k::%[1]s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)),
l AS (SELECT t.%[4]s AS id FROM %[2]s AS t WHERE t.%[4]s IN (SELECT d.id FROM d) ORDER BY t.%[4]s FOR NO KEY UPDATE OF t SKIP LOCKED),
hit AS (UPDATE %[2]s AS t SET %[3]s = (%[5]s) FROM d WHERE t.%[4]s = d.id AND t.%[4]s IN (SELECT l.id FROM l) RETURNING d.k),
ins AS (INSERT INTO %[2]s AS t (%[6]s) SELECT %[7]s FROM d CROSS JOIN LATERAL (%[5]s) AS m(v)
  WHERE m.v IS NOT NULL AND NOT EXISTS (SELECT 1 FROM %[2]s AS t WHERE t.%[4]s = d.id) ORDER BY d.id
  ON CONFLICT (%[4]s) DO UPDATE SET %[3]s = excluded.%[3]s RETURNING t.%[4]s AS id, t.xmax = 0 AS created)
SELECT d.k, EXISTS (SELECT 1 FROM %[2]s AS t WHERE t.%[4]s = d.id), d.id IN (SELECT l.id FROM l), false
FROM d WHERE d.k NOT IN (SELECT hit.k FROM hit) AND d.id NOT IN (SELECT ins.id FROM ins)
UNION ALL
SELECT d.k, false, false, true FROM d JOIN ins ON ins.id = d.id WHERE ins.created`,
		tkey.Full, tgt.Ident(), col, tkeyID, value, strings.Join(cols, ", "), strings.Join(vals, ", "))
}

// buildSeed writes the seed of a create_missing counter (Resolved.Seed):
// an INSERT of a target row, with the column's empty value and the
// declared defaults, for each key whose filtered source rows have no
// target row, in key order (the order a flush's INSERT takes its keys in,
// so that the two never wait for each other in a cycle). The empty value
// adds nothing: the measurement that follows in the same run sets the
// row to its true value through the stream (the pending changes of the
// key, streamed deltas that find the row, are accounted for as any
// key's), and the aggregator sees an INSERT with nothing in the column,
// not a seeded row (design rule 17).
func (r *Resolved) buildSeed(src, tgt *Table, tkey Column, filter string) {
	c := r.Counter
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	empty := "0"
	if r.Extremum {
		empty = "NULL"
	}
	cols := []string{tkeyID, pgx.Identifier{c.Column}.Sanitize()}
	vals := []string{"k.id", fmt.Sprintf("CAST(%s AS %s)", empty, tgt.Columns[c.Column].Full)}
	for _, name := range sortedKeys(c.Defaults) {
		cols = append(cols, pgx.Identifier{name}.Sanitize())
		vals = append(vals, fmt.Sprintf("CAST(%s AS %s)", quoteLiteral(c.Defaults[name]), tgt.Columns[name].Full))
	}
	if ext, _ := c.Extremum(); ext != "" {
		filter += " AND s." + pgx.Identifier{ext}.Sanitize() + " IS NOT NULL"
	}
	var keys string
	if c.Keyless() {
		keys = fmt.Sprintf("SELECT CAST(%s AS %s) AS id WHERE EXISTS (SELECT 1 FROM %s AS s WHERE true%s)", quoteLiteral(c.TargetRow), tkey.Full, src.Ident(), filter)
	} else {
		keyID := pgx.Identifier{c.Key}.Sanitize()
		keys = fmt.Sprintf("SELECT DISTINCT CAST(s.%s AS %s) AS id FROM %s AS s WHERE s.%s IS NOT NULL%s", keyID, tkey.Full, src.Ident(), keyID, filter)
	}
	r.Seed = fmt.Sprintf(`INSERT INTO %[1]s AS t (%[2]s) SELECT %[3]s FROM (%[4]s) AS k
WHERE NOT EXISTS (SELECT 1 FROM %[1]s AS t WHERE t.%[5]s = k.id) ORDER BY k.id
ON CONFLICT (%[5]s) DO NOTHING RETURNING t.%[5]s::text`,
		tgt.Ident(), strings.Join(cols, ", "), strings.Join(vals, ", "), keys, tkeyID)
}

// buildFill writes Fill: the column of the target rows with the keys $1
// (text[]) set to the value of their source rows now (FilterArgs bound
// after $1), as the column's type holds it: a count, a sum, a max or min
// (NULL with no row). A seed creates target rows and fills them in its
// own transaction, so that no reader ever sees a created row with a value
// other than the one its rows give (issue 35: a row created with 0 until
// the backfill reached it was wrong for the time between).
func (r *Resolved) buildFill(src, tgt *Table, key, tkey Column, value, filter, onlyRow string) {
	c := r.Counter
	col := pgx.Identifier{c.Column}.Sanitize()
	tkeyID := pgx.Identifier{c.TargetKey}.Sanitize()
	if ext, fn := c.Extremum(); ext != "" {
		value = fmt.Sprintf("%s(s.%s)", fn, pgx.Identifier{ext}.Sanitize())
	}
	match := ""
	if !c.Keyless() {
		match = fmt.Sprintf(" AND s.%s = CAST(t.%s::text AS %s)", pgx.Identifier{c.Key}.Sanitize(), tkeyID, key.Full)
	}
	r.Fill = fmt.Sprintf(`UPDATE %[1]s AS t SET %[2]s = CAST((SELECT %[3]s FROM %[4]s AS s WHERE true%[5]s%[6]s) AS %[7]s)
WHERE t.%[8]s = ANY (CAST($1::text[] AS %[9]s[]))%[10]s`,
		tgt.Ident(), col, value, src.Ident(), match, filter, tgt.Columns[c.Column].Full, tkeyID, tkey.Full, onlyRow)
}
