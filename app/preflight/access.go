package preflight

import (
	"fmt"
	"strings"

	"github.com/walcount/walcount/counter"
)

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
