package preflight

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/counter"
)

// writer is a trigger or rule that writes a counter column.
type writer struct {
	Kind, Name, On, Drop string
}

// checkOtherWriters finds what else writes the counter column of c: a
// user trigger (on any table) whose function updates the target and sets
// the column, a trigger on the target that assigns NEW.column, and a rule
// whose action updates the column (pg_depend records the columns a rule
// uses). Each would add its own count beside walcount's deltas, and a
// backfill cannot tell one from the other: walcount run refuses to start
// until they are dropped (docs/cutover.md). The text match on function
// bodies is what PostgreSQL allows: a PL/pgSQL body records no
// dependencies. A writer in the application (Rails' counter_cache, an
// ORM callback) is out of its sight; the docs say so.
func (r *run) checkOtherWriters(c counter.Counter, tgt *table, prefix string) error {
	if tgt.Schema == counter.ViaSchema {
		return nil // walcount's own via table
	}
	if r.once["writers "+c.Target+"."+c.Column] {
		return nil
	}
	r.once["writers "+c.Target+"."+c.Column] = true
	quoted := func(s string) string { return `"?` + regexp.QuoteMeta(s) + `"?` }
	// UPDATE [ONLY] [schema.]table [[AS] alias] SET [..., ] column = : the
	// column assigned in the SET list, first or after a comma (not read
	// in the WHERE clause).
	update := fmt.Sprintf(`update\s+(only\s+)?(%s\s*\.\s*)?%s(\s+(as\s+)?\w+)?\s+set\s+([^;]*,\s*)?%s\s*=`,
		quoted(tgt.Schema), quoted(tgt.Name), quoted(c.Column))
	assign := fmt.Sprintf(`\mnew\s*\.\s*%s\s*(:=|=)`, quoted(c.Column))
	rows, err := r.conn.Query(r.ctx, `
SELECT 'trigger', t.tgname, t.tgrelid::regclass::text,
       format('DROP TRIGGER %I ON %s;', t.tgname, t.tgrelid::regclass)
FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
JOIN pg_class k ON k.oid = t.tgrelid JOIN pg_namespace n ON n.oid = k.relnamespace
WHERE NOT t.tgisinternal AND t.tgenabled <> 'D' AND n.nspname <> 'walcount'
  AND (p.prosrc ~* $2 OR (t.tgrelid = $1 AND t.tgtype & 2 <> 0 AND p.prosrc ~* $3))
UNION ALL
SELECT DISTINCT 'rule', w.rulename::text, w.ev_class::regclass::text,
       format('DROP RULE %I ON %s;', w.rulename, w.ev_class::regclass)
FROM pg_rewrite w JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = w.oid
WHERE w.rulename <> '_RETURN' AND d.refclassid = 'pg_class'::regclass AND d.refobjid = $1
  AND d.refobjsubid = (SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = $1 AND a.attname = $4)
  AND pg_get_ruledef(w.oid) ~* $2
ORDER BY 1 DESC, 3, 2`, tgt.OID, update, assign, c.Column)
	if err != nil {
		return r.queryFailed(CheckOtherWriters, prefix+"triggers and rules that write "+tgt.sql, err)
	}
	ws, err := pgx.CollectRows(rows, pgx.RowToStructByPos[writer])
	if err != nil {
		return r.queryFailed(CheckOtherWriters, prefix+"triggers and rules that write "+tgt.sql, err)
	}
	col := tgt.sql + "." + r.ident(c.Column)
	if len(ws) == 0 {
		r.ok(CheckOtherWriters, fmt.Sprintf("%sno trigger or rule writes %s", prefix, col))
		return nil
	}
	var names, drops []string
	for _, w := range ws {
		names = append(names, fmt.Sprintf("%s %s on %s", w.Kind, r.ident(w.Name), w.On))
		drops = append(drops, w.Drop)
	}
	verb, it := "writes", "it"
	if len(ws) > 1 {
		verb, it = "write", "them"
	}
	r.problem(CheckOtherWriters, fmt.Sprintf("%s%s %s %s, which walcount keeps: walcount and they would both count every change, and the column would drift by what they count; drop %s after walcount setup and before walcount run (docs/cutover.md)",
		prefix, strings.Join(names, ", "), verb, col, it), strings.Join(drops, " "))
	return nil
}
