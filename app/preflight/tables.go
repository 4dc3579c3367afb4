package preflight

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/counter"
)

// table is what the catalogs say about one table of a counter, and its
// name as SQL, quoted where needed (public.likes), for the fixes.
type table struct {
	*counter.Table
	sql string
}

// keyFamilies maps the key types walcount can carry in Redis and in the
// flush statement's unnest() arrays to their family: keys of one family
// compare equal across types (a smallint likes.post_id matches a bigint
// posts.id).
var keyFamilies = map[string]string{
	"smallint": "integer", "integer": "integer", "bigint": "integer",
	"uuid": "uuid",
	"text": "text", "character varying": "text",
}

// counterTypes are the types a counter column may have; sumTypes those a
// summed column may have.
var (
	counterTypes = []string{"integer", "bigint", "numeric"}
	sumTypes     = []string{"smallint", "integer", "bigint", "numeric", "boolean"}
)

// lookupTable returns the catalog facts of a canonical table name.
func (r *run) lookupTable(canonical string) (*table, error) {
	if t, ok := r.tables[canonical]; ok {
		return t, nil
	}
	schema, name := counter.SplitTable(canonical)
	ct, err := counter.ReadTable(r.ctx, r.conn, schema, name)
	if err != nil {
		return nil, err
	}
	t := &table{Table: ct, sql: r.qualified(schema, name)}
	r.tables[canonical] = t
	return t, nil
}

// checkCounters checks the tables, columns, privileges, indexes and replica
// identity of every counter.
func (r *run) checkCounters() error {
	for i, c := range r.cfg.Counters {
		if err := r.checkCounter(i, c); err != nil {
			return err
		}
	}
	return r.checkCreateMissing()
}

// viaField names, for a counter of a via table, the field of the declared
// counter through a parent that sets what field sets in it.
func viaField(c counter.Counter, field string) string {
	if !c.IsVia() || c.Through.Role == counter.RoleTotal {
		return field
	}
	switch {
	case field == "source":
		return "via.table"
	case field == "key":
		return "via.key"
	case field == "sum":
		return "via.column"
	case strings.HasPrefix(field, "where."):
		return "via." + field
	}
	return field
}

// declaredIndex is the index of the declared counter a counter of a via
// table was expanded from, or i.
func (r *run) declaredIndex(i int, c counter.Counter) int {
	if c.IsVia() {
		for j, d := range r.cfg.Counters {
			if d.Name == c.Through.Counter {
				return j
			}
		}
	}
	return i
}

func (r *run) checkCounter(i int, c counter.Counter) error {
	prefix := "counter " + c.Name + ": "
	if c.IsVia() {
		prefix = "counter " + c.Through.Counter + ": "
		if c.Through.Role != counter.RoleTotal {
			prefix = fmt.Sprintf("counter %s (through %s): ", c.Through.Counter, c.Source)
		}
	}
	i = r.declaredIndex(i, c)
	src, err := r.lookupTable(c.Source)
	if err != nil {
		return r.queryFailed(CheckTable, prefix+"source table", err)
	}
	tgt, err := r.lookupTable(c.Target)
	if err != nil {
		return r.queryFailed(CheckTable, prefix+"target table", err)
	}

	tablesOK, viaPending := true, false
	for _, tt := range []struct {
		t     *table
		role  string
		field string
	}{{src, "source", "source"}, {tgt, "target", "target"}} {
		switch {
		case !tt.t.Exists && c.Through != nil && tt.t.Schema+"."+tt.t.Name == counter.ViaTable(c.Through.Counter):
			// walcount setup creates it: one finding per via table.
			tablesOK, viaPending = false, true
			if !r.viaMissing[tt.t.Name] {
				if r.viaMissing == nil {
					r.viaMissing = map[string]bool{}
				}
				r.viaMissing[tt.t.Name] = true
				r.setupProblem(CheckTable, fmt.Sprintf("counter %s: its via table %s does not exist", c.Through.Counter, tt.t.sql), "walcount setup")
			}
		case !tt.t.Exists:
			tablesOK = false
			r.configProblem(CheckTable, fmt.Sprintf("%s%s table %s does not exist in %s", prefix, tt.role, tt.t.sql, r.where()),
				r.configFix(c, fmt.Sprintf("create it, or set counters[%d].%s in %s", i, tt.field, r.configFileName())))
		case tt.t.Kind != "r" && tt.t.Kind != "p":
			tablesOK = false
			r.configProblem(CheckTable, fmt.Sprintf("%s%s %s is not a table (relkind %s)", prefix, tt.role, tt.t.sql, tt.t.Kind),
				r.configFix(c, fmt.Sprintf("set counters[%d].%s in %s to a table", i, tt.field, r.configFileName())))
		}
	}
	if !tablesOK {
		if viaPending && src.Exists && (src.Kind == "r" || src.Kind == "p") {
			// What setup cannot make is worth reporting before it runs:
			// the source's identity, for the columns that exist.
			return r.sourceIdentity(c, src, prefix)
		}
		return nil
	}

	if err := r.checkColumns(i, c, src, tgt, prefix); err != nil {
		return err
	}
	if err := r.checkPrivileges(c, src, tgt, prefix); err != nil {
		return err
	}
	if err := r.checkRowSecurity(src, tgt, prefix); err != nil {
		return err
	}
	if err := r.checkLogged(src, tgt, prefix); err != nil {
		return err
	}
	if err := r.checkIndexes(c, src, tgt, prefix); err != nil {
		return err
	}
	r.checkTargetIdentity(c, tgt, prefix)
	if err := r.checkTargetRules(c, tgt, prefix); err != nil {
		return err
	}
	if err := r.checkOtherWriters(c, tgt, prefix); err != nil {
		return err
	}
	return r.sourceIdentity(c, src, prefix)
}

// sourceIdentity checks the source's replica identity. It is about the
// source alone: it is worth reporting even when the target is wrong, as
// long as the columns it must carry exist.
func (r *run) sourceIdentity(c counter.Counter, src *table, prefix string) error {
	if c.IsVia() && c.Through.Role == counter.RoleTarget {
		// The passes counter of the same parent reads every column this
		// one reads (the key and via.column) and more: one finding for
		// the parent.
		return nil
	}
	for _, col := range readColumns([]counter.Counter{c}, src) {
		if _, found := src.Columns[col]; !found {
			return nil
		}
	}
	return r.checkIdentity(c, src, prefix)
}

// where names the database the checks run against, as "database app on
// db:5432 (user walcount)": a table that does not exist is often in another
// database than the one the URL names. It never shows the password.
func (r *run) where() string {
	cc := r.conn.Config()
	return fmt.Sprintf("database %s on %s (user %s)", r.database, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cc.User)
}

// configFileName names the configuration file in a fix.
func (r *run) configFileName() string {
	if r.cfg.File == "" {
		return "the config file"
	}
	return r.cfg.File
}

// configFix returns fix, the change to make in the config file, unless
// no config file is in use and c is the default counter: there is no file
// to change then, and the likely causes are another database or an app
// whose tables have other names.
func (r *run) configFix(c counter.Counter, fix string) string {
	if r.cfg.File != "" || !isDefaultCounter(c) {
		return fix
	}
	d := counter.Default()
	return fmt.Sprintf("no config file is in use, so walcount keeps its default counter (%s.%s into %s.%s), which needs tables %s and %s: "+
		"if this is the wrong database, point --database-url or WALCOUNT_DATABASE_URL at the right one; "+
		"to count other tables, give a config file with counters (--config; see docs/configuration.md)",
		d.Source, d.Key, d.Target, d.Column, d.Source, d.Target)
}

// isDefaultCounter reports whether c is counter.Default() (after
// canonicalisation, which leaves the default as it is).
func isDefaultCounter(c counter.Counter) bool {
	d := counter.Default()
	return c.Name == d.Name && c.Source == d.Source && c.Key == d.Key && c.Target == d.Target &&
		c.TargetKey == d.TargetKey && c.Column == d.Column && c.Sum == d.Sum && len(c.Where) == 0 && len(c.Filters) == 0 && c.TargetRow == ""
}

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

// checkPrivileges checks that the role can read the source (reconcile
// counts it) and read and update the counter column by the target key (the
// flush statement).
func (r *run) checkPrivileges(c counter.Counter, src, tgt *table, prefix string) error {
	var missing []string
	var fixes []string
	var srcSelect bool
	if err := r.conn.QueryRow(r.ctx, "SELECT has_table_privilege($1::oid, 'SELECT')", src.OID).Scan(&srcSelect); err != nil {
		return r.queryFailed(CheckPrivilege, prefix+"privileges on "+src.sql, err)
	}
	if !srcSelect {
		missing = append(missing, "SELECT on "+src.sql)
		fixes = append(fixes, fmt.Sprintf("GRANT SELECT ON %s TO %s;", src.sql, r.ident(r.user)))
	}

	var selCols, updCols []string
	for _, p := range []struct{ col, priv string }{
		{c.TargetKey, "SELECT"}, {c.Column, "SELECT"}, {c.Column, "UPDATE"},
	} {
		if _, found := tgt.Columns[p.col]; !found {
			continue // reported by checkColumns
		}
		var has bool
		if err := r.conn.QueryRow(r.ctx, "SELECT has_column_privilege($1::oid, $2::text, $3::text)", tgt.OID, p.col, p.priv).Scan(&has); err != nil {
			return r.queryFailed(CheckPrivilege, prefix+"privileges on "+tgt.sql, err)
		}
		if has {
			continue
		}
		missing = append(missing, fmt.Sprintf("%s on %s.%s", p.priv, tgt.sql, r.ident(p.col)))
		if p.priv == "SELECT" {
			selCols = append(selCols, r.ident(p.col))
		} else {
			updCols = append(updCols, r.ident(p.col))
		}
	}
	var grants []string
	if len(selCols) > 0 {
		grants = append(grants, fmt.Sprintf("SELECT (%s)", strings.Join(selCols, ", ")))
	}
	if len(updCols) > 0 {
		grants = append(grants, fmt.Sprintf("UPDATE (%s)", strings.Join(updCols, ", ")))
	}
	if len(grants) > 0 {
		fixes = append(fixes, fmt.Sprintf("GRANT %s ON %s TO %s;", strings.Join(grants, ", "), tgt.sql, r.ident(r.user)))
	}

	if len(missing) > 0 {
		r.accessProblem(CheckPrivilege, fmt.Sprintf("%srole %s lacks %s", prefix, r.user, strings.Join(missing, ", ")), strings.Join(fixes, " "))
		return nil
	}
	r.ok(CheckPrivilege, fmt.Sprintf("%srole %s may read %s and update %s.%s", prefix, r.user, src.sql, tgt.sql, r.ident(c.Column)))
	return nil
}

// checkIndexes warns when a key has no index whose leading column it is:
// every flush looks target rows up by target_key, and every reconcile batch
// counts the source rows of a range of keys.
func (r *run) checkIndexes(c counter.Counter, src, tgt *table, prefix string) error {
	for _, k := range []struct {
		t   *table
		col string
		why string
	}{
		{tgt, c.TargetKey, "every flush looks rows up by it, so it scans the table"},
		{src, c.Key, "every reconcile batch counts the rows of a range of keys by it, so a reconcile would scan the whole table once per batch (an index that does not lead with it does not help)"},
	} {
		if k.col == "" {
			continue // a total with no key reads the whole source
		}
		if _, found := k.t.Columns[k.col]; !found {
			continue // reported by checkColumns
		}
		var indexed bool
		err := r.conn.QueryRow(r.ctx, `
SELECT EXISTS (
  SELECT 1 FROM pg_index i
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
  WHERE i.indrelid = $1 AND a.attname = $2 AND i.indpred IS NULL)`, k.t.OID, k.col).Scan(&indexed)
		if err != nil {
			return r.queryFailed(CheckIndex, prefix+"indexes of "+k.t.sql, err)
		}
		if !indexed {
			r.warn(CheckIndex, fmt.Sprintf("%sno index on %s (%s): %s", prefix, k.t.sql, r.ident(k.col), k.why),
				fmt.Sprintf("CREATE INDEX CONCURRENTLY ON %s (%s);", k.t.sql, r.ident(k.col)))
		}
	}
	return nil
}

// sortedKeys returns the keys of m in order, so that findings are stable.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkTargetIdentity checks that a delete of a target row carries its
// target key, so that the deltas buffered for the row can be dropped and
// do not land on a row inserted later with the same key (design rule 17).
func (r *run) checkTargetIdentity(c counter.Counter, tgt *table, prefix string) {
	if _, found := tgt.Columns[c.TargetKey]; !found || !tgt.IdentityUsable() {
		return // reported by checkColumns and checkPublication
	}
	if tgt.ReplIdent == "f" || slices.Contains(tgt.Identity, c.TargetKey) {
		r.ok(CheckTargetIdentity, fmt.Sprintf("%sa delete of a %s row carries its key %s", prefix, tgt.sql, r.ident(c.TargetKey)))
		return
	}
	r.problem(CheckTargetIdentity,
		fmt.Sprintf("%starget key %s.%s is not in the replica identity of %s: when a row is deleted walcount cannot tell which key's buffered deltas to drop, and they would land on a row inserted later with the same key",
			prefix, tgt.sql, r.ident(c.TargetKey), tgt.sql),
		fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL; (or a unique index on %s and REPLICA IDENTITY USING INDEX)", tgt.sql, r.ident(c.TargetKey)))
}

// checkRowSecurity checks that row-level security lets the role see every
// row of the source (reconciliation counts them) and of the target (the
// flush updates them): a policy that hides rows makes COUNT(*) count only
// the rows it lets through, with no error, and a backfill or reconcile
// would "correct" exact counters to that (docs/design.md, "Row-level
// security"). Like a missing privilege, it is the database's to fix.
func (r *run) checkRowSecurity(src, tgt *table, prefix string) error {
	for _, t := range []struct {
		t      *table
		source bool
	}{{src, true}, {tgt, false}} {
		v, err := counter.ReadRowView(r.ctx, r.conn, t.t.sql, t.source)
		if err != nil {
			return r.queryFailed(CheckRowSecurity, prefix+"row-level security of "+t.t.sql, err)
		}
		switch {
		case v.Partial():
			r.problem(CheckRowSecurity, prefix+v.Why(), v.Fix())
		case v.Active:
			r.ok(CheckRowSecurity, fmt.Sprintf("%srow-level security applies to role %s on %s, and a policy USING (true) lets it see every row", prefix, r.user, t.t.sql))
		case v.Enabled:
			r.ok(CheckRowSecurity, fmt.Sprintf("%srow-level security of %s does not apply to role %s", prefix, t.t.sql, r.user))
		}
	}
	return nil
}

// checkLogged checks that the source and target, and every partition of
// them, are logged: changes of an UNLOGGED table are not in the WAL, so
// walcount would never count them, and an unlogged target loses its
// counts at a crash while W says they were applied. Counting such a table
// is a configuration walcount cannot run with, hence a configuration
// problem (exit status 2), whose fix is to make the table logged.
func (r *run) checkLogged(src, tgt *table, prefix string) error {
	for _, t := range []struct {
		t    *table
		role string
	}{{src, "source"}, {tgt, "target"}} {
		unlogged, err := counter.UnloggedParts(r.ctx, r.conn, t.t.sql)
		if err != nil {
			return r.queryFailed(CheckLogged, prefix+"persistence of "+t.t.sql, err)
		}
		if len(unlogged) == 0 {
			continue
		}
		what := "its changes are not in the WAL, so walcount would never count them"
		if t.role == "target" {
			what = "its changes are not in the WAL, and a crash empties it while walcount's checkpoint says the counts are applied"
		}
		which := fmt.Sprintf("%s %s is UNLOGGED", t.role, t.t.sql)
		if len(unlogged) > 1 || unlogged[0] != t.t.sql {
			which = fmt.Sprintf("%s %s has UNLOGGED partitions (%s)", t.role, t.t.sql, strings.Join(unlogged, ", "))
		}
		r.configProblem(CheckLogged, fmt.Sprintf("%s%s: %s", prefix, which, what), counter.SetLoggedFix(unlogged))
	}
	return nil
}

// checkTargetRules reports what acts on the flush's UPDATE of the counter
// column (design rule 2): a user trigger on UPDATE of the target that
// fires for it (no column list, or one naming the counter column), and a
// CHECK constraint over the column. Neither stops walcount, which parks
// the key whose update fails and applies the others, but each deserves a
// look.
func (r *run) checkTargetRules(c counter.Counter, tgt *table, prefix string) error {
	rows, err := r.conn.Query(r.ctx, `
SELECT t.tgname, CASE WHEN t.tgtype & 2 <> 0 THEN 'BEFORE' WHEN t.tgtype & 64 <> 0 THEN 'INSTEAD OF' ELSE 'AFTER' END,
       t.tgtype & 1 <> 0, t.tgenabled <> 'D'
FROM pg_trigger t
WHERE t.tgrelid = $1::regclass AND NOT t.tgisinternal AND t.tgtype & 16 <> 0
  AND (cardinality(t.tgattr::int2[]) = 0
       OR (SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = t.tgrelid AND a.attname = $2) = ANY (t.tgattr::int2[]))
ORDER BY t.tgname`, tgt.sql, c.Column)
	if err != nil {
		return r.queryFailed(CheckTargetRules, prefix+"triggers of the target", err)
	}
	type trig struct {
		Name, When   string
		Row, Enabled bool
	}
	trigs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[trig])
	if err != nil {
		return r.queryFailed(CheckTargetRules, prefix+"triggers of the target", err)
	}
	col := tgt.sql + "." + r.ident(c.Column)
	for _, t := range trigs {
		if !t.Enabled {
			continue
		}
		level := "statement"
		if t.Row {
			level = "row"
		}
		r.warn(CheckTargetRules, fmt.Sprintf("%strigger %s (%s UPDATE, for each %s) on %s fires for every flush's update of %s: "+
			"one that raises for some rows (archived posts made read-only) parks those keys, one that returns NULL skips their update "+
			"and parks them too (walcount keeps their deltas, applies every other key, retries the parked ones every minute), "+
			"and a slow one slows every flush", prefix, r.ident(t.Name), t.When, level, tgt.sql, col),
			fmt.Sprintf("if it need not act on counter updates, fire it on the other columns only (CREATE TRIGGER %s ... %s UPDATE OF <the other columns> ON %s), "+
				"or let it pass an update that changes %s alone", r.ident(t.Name), t.When, tgt.sql, r.ident(c.Column)))
	}
	rows, err = r.conn.Query(r.ctx, `
SELECT c.conname, pg_get_constraintdef(c.oid)
FROM pg_constraint c
WHERE c.conrelid = $1::regclass AND c.contype = 'c'
  AND (SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attname = $2) = ANY (c.conkey)
ORDER BY c.conname`, tgt.sql, c.Column)
	if err != nil {
		return r.queryFailed(CheckTargetRules, prefix+"CHECK constraints of the target", err)
	}
	type check struct{ Name, Def string }
	checks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[check])
	if err != nil {
		return r.queryFailed(CheckTargetRules, prefix+"CHECK constraints of the target", err)
	}
	for _, ck := range checks {
		r.warn(CheckTargetRules, fmt.Sprintf("%sCHECK constraint %s on %s (%s): it holds for the true counts, but a column that is off "+
			"(as before the backfill reaches a key) can fail it on a delta; walcount then parks that key, keeps its delta and "+
			"repairs it by reconciliation, and every other key goes on", prefix, r.ident(ck.Name), col, ck.Def), "")
	}
	return nil
}

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
		for _, col := range append([]string{c.TargetKey, c.Column}, mapsKeys(c.Defaults)...) {
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
			for _, d := range mapsKeys(c.Defaults) {
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

func mapsKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
