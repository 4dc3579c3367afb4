package counter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/operator"
)

// ErrPartialView is wrapped when row-level security lets walcount's role
// see only some rows of a counter's source or target: a COUNT(*) or SUM()
// then measures the rows it sees, not the counter, and reconciliation
// would "correct" exact counters to that (docs/design.md, "Row-level
// security").
var ErrPartialView = operator.NewError("row-level security hides rows from walcount's role")

// Commands walcount runs on a counter's tables, as pg_policy.polcmd spells
// them: it reads the source (reconciliation), and reads and updates the
// target (the flush, and reconciliation's column reads).
var (
	sourceCommands = []string{"r"}
	targetCommands = []string{"r", "w"}
)

// RowView is what row-level security lets the current role see of one
// table.
type RowView struct {
	// Table is schema.table, and Role the current role, both quoted as
	// the server would write them in SQL.
	Table, Role string
	// Source is true for a counter's source, false for its target.
	Source bool
	// Enabled and Forced are pg_class.relrowsecurity and
	// relforcerowsecurity; Owner says the role has the owner's
	// privileges, Bypass that it is a superuser or has BYPASSRLS.
	Enabled, Forced, Owner, Bypass bool
	// Active is row_security_active(): the table's policies apply to the
	// role.
	Active bool
	// Full is true when the policies that apply let the role see every
	// row anyway: for every command walcount runs, a permissive policy for
	// the role (or PUBLIC) with USING (true) (and, for UPDATE, WITH CHECK
	// (true) or none), and no restrictive policy at all. Anything else,
	// however permissive it looks, counts as partial: walcount cannot
	// prove what an expression lets through.
	Full bool
	// Policies names the policies that apply to the role; Restrictive
	// those of them that are restrictive.
	Policies, Restrictive []string
}

// Partial reports whether the role may see fewer rows than there are.
func (v RowView) Partial() bool { return v.Active && !v.Full }

// Why says, for an error or a finding, why v is partial.
func (v RowView) Why() string {
	var b strings.Builder
	fmt.Fprintf(&b, "row-level security is enabled on %s and applies to role %s", v.Table, v.Role)
	if v.Owner {
		b.WriteString(" although it owns the table, because of FORCE ROW LEVEL SECURITY,")
	} else {
		b.WriteString(", which does not own the table")
	}
	b.WriteString(" and has neither SUPERUSER nor BYPASSRLS: ")
	switch {
	case len(v.Policies) == 0:
		b.WriteString("no policy applies to it, so it sees no row at all")
	case len(v.Restrictive) > 0:
		fmt.Fprintf(&b, "restrictive policy %s applies to it, so it may see only some rows", strings.Join(v.Restrictive, ", "))
	default:
		what := "SELECT"
		if !v.Source {
			what = "SELECT and for UPDATE (with WITH CHECK (true) or none)"
		}
		fmt.Fprintf(&b, "of the policies that apply to it (%s), none is a permissive one USING (true) for %s, so it may see only some rows",
			strings.Join(v.Policies, ", "), what)
	}
	if v.Source {
		b.WriteString("; a COUNT(*) or SUM() would count only those, and reconciliation would \"correct\" the counter to them")
	} else {
		b.WriteString("; the flush could not update the rows it does not see, and reconciliation could not read them")
	}
	return b.String()
}

// Fix returns what lets the role see every row.
func (v RowView) Fix() string {
	policy := fmt.Sprintf("CREATE POLICY walcount_all ON %s FOR SELECT TO %s USING (true);", v.Table, v.Role)
	if !v.Source {
		policy = fmt.Sprintf("CREATE POLICY walcount_all ON %s FOR ALL TO %s USING (true) WITH CHECK (true);", v.Table, v.Role)
	}
	fix := fmt.Sprintf("ALTER ROLE %s BYPASSRLS; (as a superuser) or %s", v.Role, policy)
	if len(v.Restrictive) > 0 {
		fix += fmt.Sprintf(" and drop or widen restrictive policy %s", strings.Join(v.Restrictive, ", "))
	}
	if v.Owner && v.Forced {
		fix += fmt.Sprintf(" or ALTER TABLE %s NO FORCE ROW LEVEL SECURITY;", v.Table)
	}
	return fix
}

// ReadRowView reads what row-level security lets the current role see of
// table (schema.table, quoted where needed). source says whether it is a
// counter's source (walcount reads it) or target (walcount reads and
// updates it). A table that does not exist has a zero RowView.
func ReadRowView(ctx context.Context, q Querier, table string, source bool) (RowView, error) {
	cmds := targetCommands
	if source {
		cmds = sourceCommands
	}
	v := RowView{Source: source}
	err := q.QueryRow(ctx, `
WITH t AS (
  SELECT c.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name,
         c.relrowsecurity, c.relforcerowsecurity, pg_has_role(c.relowner, 'USAGE') AS owner
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE c.oid = to_regclass($1)),
pol AS (
  SELECT p.polname::text AS name, p.polcmd::text AS cmd, p.polpermissive AS permissive,
         pg_get_expr(p.polqual, p.polrelid) AS qual, pg_get_expr(p.polwithcheck, p.polrelid) AS withcheck
  FROM pg_policy p JOIN t ON p.polrelid = t.oid
  WHERE (p.polcmd = '*' OR p.polcmd::text = ANY ($2::text[]))
    AND (p.polroles @> '{0}' OR EXISTS (SELECT FROM unnest(p.polroles) r WHERE r <> 0 AND pg_has_role(r, 'USAGE'))))
SELECT t.name, quote_ident(current_user), t.relrowsecurity, t.relforcerowsecurity, t.owner,
       (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user),
       row_security_active(t.oid),
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pol),
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pol WHERE NOT permissive),
       NOT EXISTS (SELECT FROM pol WHERE NOT permissive)
         AND (SELECT bool_and(EXISTS (
               SELECT FROM pol WHERE permissive AND (pol.cmd = '*' OR pol.cmd = c.cmd) AND qual = 'true'
                 AND (c.cmd <> 'w' OR withcheck IS NULL OR withcheck = 'true')))
              FROM unnest($2::text[]) AS c(cmd))
FROM t`, table, cmds).Scan(&v.Table, &v.Role, &v.Enabled, &v.Forced, &v.Owner, &v.Bypass, &v.Active, &v.Policies, &v.Restrictive, &v.Full)
	if errors.Is(err, pgx.ErrNoRows) {
		return RowView{Source: source}, nil
	}
	if err != nil {
		return RowView{}, fmt.Errorf("read the row-level security of %s: %w", table, err)
	}
	return v, nil
}

// CheckRowViews returns an error wrapping ErrPartialView, with why and the
// fix, when row-level security lets the current role see only some rows
// of c's source or target; nil when it sees every row of both.
func CheckRowViews(ctx context.Context, q Querier, c Counter) error {
	if err := checkView(ctx, q, c, c.Source, true); err != nil {
		return err
	}
	return CheckTargetView(ctx, q, c)
}

// CheckTargetView is CheckRowViews for c's target alone. The flush updates
// its rows by key: a row a policy hides from walcount's role would look
// like a row that does not exist, and its deltas would be dropped.
func CheckTargetView(ctx context.Context, q Querier, c Counter) error {
	return checkView(ctx, q, c, c.Target, false)
}

func checkView(ctx context.Context, q Querier, c Counter, table string, source bool) error {
	v, err := ReadRowView(ctx, q, quoted(table), source)
	if err != nil {
		return fmt.Errorf("counter %s: %w", c.Name, err)
	}
	if v.Partial() {
		return fmt.Errorf("counter %s: %w: %s; fix: %s", c.Name, ErrPartialView, v.Why(), v.Fix())
	}
	return nil
}

// NoRowSecurity reports whether no policy of c's source or target applies
// to the current role at all (row_security_active is false for both), as
// opposed to policies that apply but let it see every row. Only then can a
// reading transaction set row_security = off, which turns any policy
// enabled meanwhile into an error instead of a silently partial count.
func NoRowSecurity(ctx context.Context, q Querier, c Counter) (bool, error) {
	var active bool
	err := q.QueryRow(ctx, `SELECT coalesce(bool_or(row_security_active(to_regclass(t))), false) FROM unnest($1::text[]) AS t`,
		[]string{quoted(c.Source), quoted(c.Target)}).Scan(&active)
	if err != nil {
		return false, fmt.Errorf("counter %s: read the row-level security of its tables: %w", c.Name, err)
	}
	return !active, nil
}

func quoted(table string) string {
	schema, name := SplitTable(table)
	return pgx.Identifier{schema, name}.Sanitize()
}

// UnloggedParts returns the tables that hold rows of table (schema.table,
// quoted where needed) and are UNLOGGED: the table itself, or any
// partition of it at any level. Their changes are not in the WAL, so
// walcount never sees them (docs/design.md, "Unlogged tables"). Names are
// quoted as the server would write them in SQL.
func UnloggedParts(ctx context.Context, q Querier, table string) ([]string, error) {
	rows, err := q.Query(ctx, `
SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
FROM (SELECT to_regclass($1) AS relid UNION SELECT relid FROM pg_partition_tree(to_regclass($1))) p
JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relpersistence = 'u' AND c.relkind <> 'p'
ORDER BY 1`, table)
	if err != nil {
		return nil, fmt.Errorf("read the persistence of %s: %w", table, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the persistence of %s: %w", table, err)
	}
	return names, nil
}

// SetLoggedFix returns the statements that make tables logged.
func SetLoggedFix(tables []string) string {
	fixes := make([]string, len(tables))
	for i, t := range tables {
		fixes[i] = fmt.Sprintf("ALTER TABLE %s SET LOGGED;", t)
	}
	return strings.Join(fixes, " ")
}
