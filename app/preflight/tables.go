package preflight

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

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
