package preflight

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/counter"
)

// checkColumns checks that every column of the counter exists with a usable
// type.
func (r *run) checkColumns(i int, c counter.Counter, src, tgt *table, prefix string) error {
	ok := true
	bad := func(msg, fix string) {
		ok = false
		r.problem(CheckColumn, prefix+msg, fix)
	}
	badConfig := func(msg, fix string) {
		ok = false
		r.configProblem(CheckColumn, prefix+msg, fix)
	}
	need := func(t *table, name, field string) (counter.Column, bool) {
		field = viaField(c, field)
		col, found := t.Columns[name]
		if !found {
			msg := fmt.Sprintf("column %s.%s does not exist", t.sql, r.ident(name))
			if near := closest(name, t.Columns); near != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", r.ident(near))
			}
			badConfig(msg, r.configFix(c, fmt.Sprintf("set counters[%d].%s in %s to a column of %s", i, field, r.configFileName(), t.sql)))
		}
		return col, found
	}

	var key counter.Column
	var keyOK bool
	tkey, tkeyOK := need(tgt, c.TargetKey, "target_key")
	if c.Keyless() {
		key, keyOK = tkey, tkeyOK
		if tkeyOK {
			if err := r.checkTargetRow(i, c, tgt, tkey, &ok); err != nil {
				return err
			}
		}
	} else {
		key, keyOK = need(src, c.Key, "key")
	}
	keyName := c.Key
	if c.Keyless() {
		keyName = c.TargetKey
	}
	for _, k := range []struct {
		t     *table
		name  string
		col   counter.Column
		found bool
	}{{src, keyName, key, keyOK && !c.Keyless()}, {tgt, c.TargetKey, tkey, tkeyOK}} {
		if k.found && keyFamilies[k.col.Base] == "" {
			bad(fmt.Sprintf("key column %s.%s is %s: keys must be smallint, integer, bigint, uuid, text or varchar", k.t.sql, r.ident(k.name), k.col.Full), "")
		}
	}
	if keyOK && tkeyOK && keyFamilies[key.Base] != "" && keyFamilies[tkey.Base] != "" && keyFamilies[key.Base] != keyFamilies[tkey.Base] {
		bad(fmt.Sprintf("key %s.%s is %s but target key %s.%s is %s: they cannot be compared",
			src.sql, r.ident(c.Key), key.Full, tgt.sql, r.ident(c.TargetKey), tkey.Full), "")
	}

	col, found := tgt.Columns[c.Column]
	ext, fn := c.Extremum()
	switch {
	case ext != "":
		if v, vfound := need(src, ext, fn); vfound {
			if err := r.checkExtremum(c, src, tgt, v, col, found, bad, badConfig, i); err != nil {
				return err
			}
		}
	case !found:
		ok = false
		r.missingCounterColumn(i, c, tgt, prefix, "bigint NOT NULL DEFAULT 0")
	case c.IsVia() && (!col.NotNull || !slices.Contains(counterTypes, col.Base)):
		// A via table made for a max or min of the same name: its total
		// is NULL for a parent with no value, and NULL + delta stays NULL.
		bad(fmt.Sprintf("counter %s: its via table %s has a total of %s that may be NULL, made for a max or min: a count or sum through a parent keeps a number for every parent", c.Through.Counter, tgt.sql, col.Full),
			fmt.Sprintf("DROP TABLE %s; then walcount setup", tgt.sql))
	case !slices.Contains(counterTypes, col.Base):
		bad(fmt.Sprintf("counter column %s.%s is %s: it must be integer, bigint or numeric", tgt.sql, r.ident(c.Column), col.Full),
			fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE bigint;", tgt.sql, r.ident(c.Column)))
	case col.Generated:
		bad(fmt.Sprintf("counter column %s.%s is a generated column and cannot be updated", tgt.sql, r.ident(c.Column)), "")
	case !col.NotNull:
		// NULL + delta is NULL: a row that starts NULL never counts.
		r.warn(CheckColumn,
			fmt.Sprintf("%scounter column %s.%s allows NULL, and NULL + delta stays NULL", prefix, tgt.sql, r.ident(c.Column)),
			fmt.Sprintf("UPDATE %[1]s SET %[2]s = 0 WHERE %[2]s IS NULL; ALTER TABLE %[1]s ALTER COLUMN %[2]s SET DEFAULT 0, ALTER COLUMN %[2]s SET NOT NULL;", tgt.sql, r.ident(c.Column)))
	}

	if c.Sum != "" && ext == "" {
		if sum, found := need(src, c.Sum, "sum"); found {
			if c.IsVia() && c.Through.Role == counter.RoleTarget && !sum.IntegerBase() {
				badConfig(fmt.Sprintf("via column %s.%s is %s: the column naming the target through a parent must be smallint, integer or bigint", src.sql, r.ident(c.Sum), sum.Full),
					r.configFix(c, fmt.Sprintf("set counters[%d].via.column in %s to an integer column of %s", i, r.configFileName(), src.sql)))
			} else if !slices.Contains(sumTypes, sum.Base) {
				// Only the configuration can fix this: the column holds
				// what it holds.
				var numeric []string
				for _, name := range sortedKeys(src.Columns) {
					if slices.Contains(sumTypes, src.Columns[name].Base) {
						numeric = append(numeric, r.ident(name))
					}
				}
				fix := fmt.Sprintf("set counters[%d].sum in %s to a smallint, integer, bigint, numeric or boolean column of %s", i, r.configFileName(), src.sql)
				if len(numeric) > 0 {
					fix += " (" + strings.Join(numeric, ", ") + ")"
				}
				fix += ", or remove sum to count rows"
				badConfig(fmt.Sprintf("summed column %s.%s is %s: it must be smallint, integer, bigint, numeric or boolean", src.sql, r.ident(c.Sum), sum.Full),
					r.configFix(c, fix))
			} else if sum.Generated {
				r.checkDerived(c, src, &ok)
			} else {
				r.checkSum(c, src, tgt, sum, col, bad)
			}
		}
	}

	for _, cd := range c.Conds() {
		w := cd.Column
		wcol, found := need(src, w, "where."+w)
		if !found {
			continue
		}
		for _, v := range cd.Values {
			// Let the server judge the literal, as it will when it compares.
			var ignored string
			err := r.conn.QueryRow(r.ctx, "SELECT CAST($1::text AS "+wcol.Full+")::text", v).Scan(&ignored)
			if err == nil {
				continue
			}
			if r.ctx.Err() != nil {
				return r.ctx.Err()
			}
			msg := err.Error()
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				msg = pgErr.Message
			}
			badConfig(fmt.Sprintf("where value %q is not a valid %s for %s.%s: %s", v, wcol.Full, src.sql, r.ident(w), msg),
				fmt.Sprintf("fix counters[%d].where.%s in %s", i, w, r.configFileName()))
		}
	}

	switch {
	case ok && c.Keyless():
		r.ok(CheckColumn, fmt.Sprintf("%severy counted row of %s counts into %s.%s (%s) of the row whose %s is %s",
			prefix, src.sql, tgt.sql, r.ident(c.Column), col.Full, r.ident(c.TargetKey), c.TargetRow))
	case ok:
		r.ok(CheckColumn, fmt.Sprintf("%s%s.%s (%s) counts into %s.%s (%s), matched on %s (%s)",
			prefix, src.sql, r.ident(c.Key), key.Full, tgt.sql, r.ident(c.Column), col.Full, r.ident(c.TargetKey), tkey.Full))
	}
	return nil
}

// checkExtremum checks a max or min counter: its column is of a type
// walcount keeps the extremum of (counter.ExtremumBase), the counter column
// has the same type, and an index on the source's (key, column) lets the
// flush find a key's extremum again when its rows change (one finding per
// source, key and column, naming every counter it concerns).
func (r *run) checkExtremum(c counter.Counter, src, tgt *table, v, col counter.Column, colFound bool, bad, badConfig func(msg, fix string), i int) error {
	ext, fn := c.Extremum()
	name := fmt.Sprintf("%s.%s", src.sql, r.ident(ext))
	switch {
	case v.Generated:
		badConfig(fmt.Sprintf("counter %s: %s column %s is a generated column, which the WAL does not carry", c.Name, fn, name),
			r.configFix(c, fmt.Sprintf("set counters[%d].%s in %s to a column the application writes", i, fn, r.configFileName())))
		return nil
	case !counter.ExtremumBase(v.BaseOID):
		badConfig(fmt.Sprintf("counter %s: %s column %s is %s: it must be smallint, integer, bigint, numeric, date, timestamp or timestamptz", c.Name, fn, name, v.Full),
			r.configFix(c, fmt.Sprintf("set counters[%d].%s in %s to a column of one of those types", i, fn, r.configFileName())))
		return nil
	}
	switch {
	case !colFound:
		r.missingCounterColumn(i, c, tgt, "counter "+c.Name+": ", v.Full)
		return nil
	case col.Generated:
		bad(fmt.Sprintf("counter %s: counter column %s.%s is a generated column and cannot be updated", c.Name, tgt.sql, r.ident(c.Column)), "")
		return nil
	case col.BaseOID != v.BaseOID && !(col.IntegerBase() && v.IntegerBase()):
		bad(fmt.Sprintf("counter %s: counter column %s.%s is %s but its %s column %s is %s: it must hold the same type", c.Name, tgt.sql, r.ident(c.Column), col.Full, fn, name, v.Full),
			fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s;", tgt.sql, r.ident(c.Column), v.Full))
		return nil
	case c.IsVia() && col.NotNull:
		// A via table made for a count or a sum of the same name: a
		// parent with no value has a NULL total. Made again, it is
		// seeded, and the counter's changed definition backfills it.
		bad(fmt.Sprintf("counter %s: its via table %s has a total NOT NULL, made for a count or a sum: a %s through a parent keeps NULL for a parent with no value", c.Through.Counter, tgt.sql, fn),
			fmt.Sprintf("DROP TABLE %s; then walcount setup", tgt.sql))
		return nil
	}
	if !r.once["extremum stats"] {
		// Before a recompute the flush waits for the transactions that
		// wait for a synchronous standby (in the stream, not yet visible),
		// which pg_stat_activity shows only to a role that may read every
		// session's statistics.
		r.once["extremum stats"] = true
		var sees bool
		var standbys string
		err := r.conn.QueryRow(r.ctx, `SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER'),
  current_setting('synchronous_standby_names')`).Scan(&sees, &standbys)
		if err != nil {
			if r.ctx.Err() != nil {
				return r.ctx.Err()
			}
			return r.queryFailed(CheckPrivilege, "counter "+c.Name+": pg_read_all_stats", err)
		}
		if !sees {
			msg := fmt.Sprintf("role %s is not a member of pg_read_all_stats: a max or min counter cannot see the transactions that wait for a synchronous standby (committed in the WAL, not yet visible), and a recompute during that wait could keep a deleted maximum until reconciliation", r.user)
			if standbys != "" {
				r.warn(CheckPrivilege, msg+fmt.Sprintf(" (synchronous_standby_names is %q)", standbys), fmt.Sprintf("GRANT pg_read_all_stats TO %s;", r.ident(r.user)))
			} else {
				r.ok(CheckPrivilege, msg+"; synchronous_standby_names is empty, so no commit waits: grant it before turning synchronous replication on")
			}
		}
	}
	// The flush reads max(column) or min(column) of each changed key: with
	// an index whose leading columns are (key, column) it is one index
	// probe, without it a scan of the key's rows.
	cols := []string{ext}
	if !c.Keyless() {
		cols = []string{c.Key, ext}
	}
	once := "extremum index " + src.sql + "." + strings.Join(cols, ",")
	if r.once[once] {
		return nil
	}
	r.once[once] = true
	// A key that is unique on its own (the source's primary key: one row
	// per key) needs no more: its unique index finds the key's one row.
	var has, single bool
	err := r.conn.QueryRow(r.ctx, `
SELECT EXISTS (SELECT 1 FROM pg_index i
  WHERE i.indrelid = $1 AND i.indisvalid AND i.indnkeyatts >= cardinality($2::text[]) AND (i.indpred IS NULL OR $3)
    AND (SELECT array_agg(a.attname::text ORDER BY k.ord) FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         WHERE k.ord <= cardinality($2::text[])) = $2::text[]),
  cardinality($2::text[]) = 2 AND EXISTS (SELECT 1 FROM pg_index i
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
    WHERE i.indrelid = $1 AND i.indisvalid AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL
      AND i.indexprs IS NULL AND a.attname = ($2::text[])[1])`, src.OID, cols, len(c.Conds()) > 0).Scan(&has, &single)
	if err != nil {
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		return r.queryFailed(CheckIndex, "counter "+c.Name+": index", err)
	}
	var names []string
	for _, o := range r.cfg.Counters {
		if oe, _ := o.Extremum(); o.Source == c.Source && oe == ext && o.Key == c.Key {
			names = append(names, o.Name)
		}
	}
	idx := make([]string, len(cols))
	for j, cn := range cols {
		idx[j] = r.ident(cn)
	}
	if single && !has {
		r.ok(CheckIndex, fmt.Sprintf("counter %s: %s has one row per %s (a unique index on %s alone): the flush reads a key's %s from that row",
			strings.Join(names, ", "), src.sql, idx[0], idx[0], fn))
		return nil
	}
	if has {
		r.ok(CheckIndex, fmt.Sprintf("counter %s: an index on %s (%s) finds a key's %s when its rows change", strings.Join(names, ", "), src.sql, strings.Join(idx, ", "), fn))
		return nil
	}
	fix := fmt.Sprintf("CREATE INDEX CONCURRENTLY ON %s (%s);", src.sql, strings.Join(idx, ", "))
	if len(c.Conds()) > 0 {
		fix += " (or a partial index with the counter's where as its WHERE)"
	}
	r.warn(CheckIndex, fmt.Sprintf("counter %s: no index on %s (%s): when a key's rows change, the flush finds its %s again by reading every row of the key",
		strings.Join(names, ", "), src.sql, strings.Join(idx, ", "), fn), fix)
	return nil
}

// checkTargetRow checks the row a total with no key is kept in: its
// target_row must be written as PostgreSQL prints the target key (the
// stream's moves of target rows name keys in that form), and the row must
// exist, or every delta would be dropped.
func (r *run) checkTargetRow(i int, c counter.Counter, tgt *table, tkey counter.Column, ok *bool) error {
	var printed string
	var exists bool
	err := r.conn.QueryRow(r.ctx, fmt.Sprintf("SELECT CAST($1::text AS %[1]s)::text, EXISTS (SELECT 1 FROM %[2]s t WHERE t.%[3]s = CAST($1::text AS %[1]s))",
		tkey.Full, tgt.sql, r.ident(c.TargetKey)), c.TargetRow).Scan(&printed, &exists)
	var pgErr *pgconn.PgError
	switch {
	case err != nil && r.ctx.Err() != nil:
		return r.ctx.Err()
	case errors.As(err, &pgErr):
		*ok = false
		r.configProblem(CheckColumn, fmt.Sprintf("counter %s: target_row %q is not a valid %s for %s.%s: %s", c.Name, c.TargetRow, tkey.Full, tgt.sql, r.ident(c.TargetKey), pgErr.Message),
			fmt.Sprintf("fix counters[%d].target_row in %s", i, r.configFileName()))
	case err != nil:
		return r.queryFailed(CheckColumn, "counter "+c.Name+": target row", err)
	case printed != c.TargetRow:
		*ok = false
		r.configProblem(CheckColumn, fmt.Sprintf("counter %s: target_row %q is written otherwise than PostgreSQL prints it (%s)", c.Name, c.TargetRow, printed),
			fmt.Sprintf("set counters[%d].target_row in %s to %s", i, r.configFileName(), printed))
	case !exists:
		*ok = false
		r.problem(CheckColumn, fmt.Sprintf("counter %s: %s has no row whose %s is %s: the total has nowhere to go, and every delta would be dropped", c.Name, tgt.sql, r.ident(c.TargetKey), c.TargetRow),
			fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s); then walcount reconcile", tgt.sql, r.ident(c.TargetKey), quoteLit(c.TargetRow)))
	}
	return nil
}

func quoteLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// checkDerived checks that a generated summed column can be derived from
// the columns the WAL carries (counter.Derive): pgoutput leaves generated
// columns out, so walcount run computes the column's expression itself,
// and refuses one it cannot compute, as this finding does. A column that
// several counters sum is one finding, naming them all.
func (r *run) checkDerived(c counter.Counter, src *table, ok *bool) {
	d, err := counter.Derive(src.Table, c.Sum)
	if err == nil {
		r.ok(CheckColumn, fmt.Sprintf("counter %s: summed column %s.%s is generated (%s): walcount derives it from %s, which the WAL carries",
			c.Name, src.sql, r.ident(c.Sum), d.Expr, strings.Join(d.Inputs(), ", ")))
		return
	}
	*ok = false
	key := "derive " + src.sql + "." + c.Sum
	if r.once[key] {
		return
	}
	r.once[key] = true
	var names []string
	for _, o := range r.cfg.Counters {
		if o.Source == c.Source && o.Sum == c.Sum {
			names = append(names, o.Name)
		}
	}
	why := err.Error()
	if i := strings.Index(why, "GENERATED ALWAYS"); i >= 0 {
		why = why[i:]
	} else if i := strings.Index(why, "it is "); i >= 0 {
		why = why[i:]
	}
	r.problem(CheckColumn, fmt.Sprintf("counter %s: summed column %s.%s is a generated column, which the WAL does not carry (PostgreSQL leaves generated columns out of logical replication, and walcount's publication does not publish them), "+
		"and walcount cannot derive it from the columns it is computed from: %s", strings.Join(names, ", "), src.sql, r.ident(c.Sum), why),
		fmt.Sprintf("sum a column the application writes (make %s.%s a regular column, or sum the columns it is computed from with one counter each), "+
			"or write its expression with integer columns, constants, +, - and * only", src.sql, r.ident(c.Sum)))
}

// checkSum checks that the summed column can be summed exactly: deltas are
// int64 counts of 10^-s units, s being the declared scale of a numeric(p,s)
// column (counter.SumScale), and the flush divides them back into the
// counter column, which must keep s fractional digits.
func (r *run) checkSum(c counter.Counter, src, tgt *table, sum, col counter.Column, bad func(msg, fix string)) {
	name := fmt.Sprintf("%s.%s", src.sql, r.ident(c.Sum))
	withScale := fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE numeric(12,2);", src.sql, r.ident(c.Sum))
	if !slices.Contains(sumTypes, sum.Base) {
		bad(fmt.Sprintf("summed column %s is %s: it must be smallint, integer, bigint, numeric or boolean", name, sum.Full), "")
		return
	}
	if sum.Base == "boolean" && sum.Domain {
		// pgoutput sends the domain's OID, whose values walcount would
		// read as integers.
		bad(fmt.Sprintf("summed column %s is %s, a domain over boolean: walcount needs the column's own boolean type to count it as +1/-1", name, sum.Full),
			fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE boolean;", src.sql, r.ident(c.Sum)))
		return
	}
	if sum.Base != "numeric" {
		return
	}
	if sum.Domain {
		// pgoutput sends the domain's OID, whose values walcount reads
		// as integers: it cannot know the domain's scale.
		bad(fmt.Sprintf("summed column %s is %s, a domain over numeric: walcount needs the column's own numeric(p,s) type to know its scale", name, sum.Full), withScale)
		return
	}
	scale, err := counter.SumScale(sum.TypeOID, sum.TypMod)
	if err != nil {
		why := "it has no declared scale, so its values may carry any number of fractional digits"
		if sum.TypMod >= 4 {
			why = fmt.Sprintf("its scale is above %d, the most an exact int64 sum holds", counter.MaxSumScale)
		}
		bad(fmt.Sprintf("summed column %s is %s: %s; declare the scale your values need", name, sum.Full, why), withScale)
		// Whatever its scale becomes, a non-numeric column cannot hold it.
		scale = 1
	}
	if scale == 0 || col.Base == "" {
		return
	}
	colScale := 0
	if col.Base == "numeric" {
		colScale = scale
		if t := col.BaseTypMod; t >= 4 {
			colScale = int((((t - 4) & 0x7ff) ^ 1024) - 1024)
		}
	}
	if colScale < scale {
		// Fractions would be rounded on every flush and the column would
		// drift away from SUM().
		bad(fmt.Sprintf("summed column %s is %s but counter column %s.%s is %s, which cannot hold its fractional digits", name, sum.Full, tgt.sql, r.ident(c.Column), col.Full),
			fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE numeric;", tgt.sql, r.ident(c.Column)))
	}
}
