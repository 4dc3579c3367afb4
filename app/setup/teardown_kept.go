package setup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// identityName is how an operator reads a pg_class.relreplident.
func identityName(r state.ReplicaIdentity) string {
	switch r.Ident {
	case "n":
		return "NOTHING"
	case "f":
		return "FULL"
	case "i":
		return "USING INDEX " + pgx.Identifier{r.Index}.Sanitize()
	}
	return "DEFAULT"
}

// restoreIdentities gives each table whose identity walcount setup set to
// FULL the identity recorded before, when restore is set, the current
// role owns the table, the table is FULL still (nobody changed it since)
// and no other publication holds it (whose updates and deletes might need
// FULL); otherwise it returns the statement as a Leftover.
func restoreIdentities(ctx context.Context, tx pgx.Tx, idents []state.ReplicaIdentity, restore bool) (restored []string, kept []Leftover, err error) {
	for _, r := range idents {
		if r.Ident == "f" {
			continue
		}
		var (
			now, owner   string
			owns, others bool
			indexOK      bool
		)
		err := tx.QueryRow(ctx, `
SELECT c.relreplident::text, pg_has_role(current_user, c.relowner, 'USAGE'), c.relowner::regrole::text,
       EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
               WHERE pr.prrelid = c.oid AND p.pubname <> ALL (SELECT coalesce(publication, 'walcount') FROM walcount.checkpoint UNION ALL SELECT 'walcount'))
       OR EXISTS (SELECT 1 FROM pg_publication p WHERE p.puballtables),
       $2 = '' OR EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
                          WHERE i.indrelid = c.oid AND ic.relname = $2)
FROM pg_class c WHERE c.oid = to_regclass($1)`, r.Relation, r.Index).Scan(&now, &owns, &owner, &others, &indexOK)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // the table is gone
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read the replica identity of %s: %w", r.Relation, err)
		}
		if now != "f" {
			continue // changed since by someone else: theirs
		}
		what := fmt.Sprintf("REPLICA IDENTITY FULL on %s, which walcount setup set (it was %s)", r.Relation, identityName(r))
		switch {
		case !indexOK:
			kept = append(kept, Leftover{What: what + "; its index " + r.Index + " no longer exists", Who: "the table's owner " + owner + ", if FULL is not wanted: give it an identity by hand"})
		case others:
			kept = append(kept, Leftover{What: what + "; another publication holds the table, whose subscribers may need FULL", SQL: []string{r.RestoreSQL() + ";"}, Who: "the table's owner " + owner + ", once no other publication needs FULL"})
		case restore && owns:
			if _, err := tx.Exec(ctx, r.RestoreSQL()); err != nil {
				return nil, nil, fmt.Errorf("restore the replica identity of %s: %w", r.Relation, err)
			}
			restored = append(restored, fmt.Sprintf("%s REPLICA IDENTITY %s", r.Relation, identityName(r)))
		case owns:
			kept = append(kept, Leftover{What: what, SQL: []string{r.RestoreSQL() + ";"}, Who: "walcount teardown --yes --restore-replica-identity, or the table's owner " + owner})
		default:
			kept = append(kept, Leftover{What: what, SQL: []string{r.RestoreSQL() + ";"}, Who: "the table's owner " + owner})
		}
	}
	return restored, kept, nil
}

// keptAfter lists what teardown leaves on purpose once the last slot is
// gone: the counter columns, the privileges granted to walcount's role on
// the counters' tables, their schemas and the database, and the role.
func keptAfter(ctx context.Context, tx pgx.Tx, counters []counter.Counter) ([]Leftover, error) {
	var kept []Leftover
	var role, db string
	var super bool
	if err := tx.QueryRow(ctx, `SELECT current_user::text, current_database()::text, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&role, &db, &super); err != nil {
		return nil, fmt.Errorf("read the current role: %w", err)
	}
	roleID := pgx.Identifier{role}.Sanitize()
	var tables []string
	for _, c := range counters {
		for _, t := range []string{c.Source, c.Target} {
			s, n := counter.SplitTable(t)
			if q := (pgx.Identifier{s, n}).Sanitize(); !slices.Contains(tables, q) {
				tables = append(tables, q)
			}
		}
		s, n := counter.SplitTable(c.Target)
		kept = append(kept, Leftover{
			What: fmt.Sprintf("column %s.%s of counter %s, with its values (the app may read them)", pgx.Identifier{s, n}.Sanitize(), pgx.Identifier{c.Column}.Sanitize(), c.Name),
			SQL:  []string{fmt.Sprintf("ALTER TABLE %s DROP COLUMN %s;", pgx.Identifier{s, n}.Sanitize(), pgx.Identifier{c.Column}.Sanitize())},
			Who:  "the table's owner, once the app no longer reads it (or keep it and let the app maintain it)",
		})
	}
	if super {
		kept = append(kept, Leftover{What: fmt.Sprintf("walcount ran as superuser %s: no privileges or role of its own to remove", role)})
		return kept, nil
	}
	// Privileges granted to the role (not those it has as an owner) on
	// the tables, their columns, their schemas and the database.
	rows, err := tx.Query(ctx, `
WITH t AS (SELECT to_regclass(name) AS oid FROM unnest($1::text[]) AS name)
SELECT 'TABLE ' || format('%I.%I', (SELECT nspname FROM pg_namespace WHERE oid = c.relnamespace), c.relname), c.relowner::regrole::text
FROM t JOIN pg_class c ON c.oid = t.oid, aclexplode(c.relacl) a
WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = current_user) AND a.grantee <> c.relowner
GROUP BY 1, 2
UNION
SELECT '(' || string_agg(DISTINCT quote_ident(att.attname), ', ') || ') ON TABLE ' || format('%I.%I', (SELECT nspname FROM pg_namespace WHERE oid = c.relnamespace), c.relname), c.relowner::regrole::text
FROM t JOIN pg_class c ON c.oid = t.oid JOIN pg_attribute att ON att.attrelid = c.oid AND att.attnum > 0, aclexplode(att.attacl) a
WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = current_user)
GROUP BY c.oid, c.relowner
UNION
SELECT 'SCHEMA ' || quote_ident(n.nspname), n.nspowner::regrole::text
FROM pg_namespace n, aclexplode(n.nspacl) a
WHERE n.oid IN (SELECT c.relnamespace FROM t JOIN pg_class c ON c.oid = t.oid)
  AND a.grantee = (SELECT oid FROM pg_roles WHERE rolname = current_user) AND a.grantee <> n.nspowner
UNION
SELECT 'DATABASE ' || quote_ident(d.datname), d.datdba::regrole::text
FROM pg_database d, aclexplode(d.datacl) a
WHERE d.datname = current_database()
  AND a.grantee = (SELECT oid FROM pg_roles WHERE rolname = current_user) AND a.grantee <> d.datdba
ORDER BY 1`, tables)
	if err != nil {
		return nil, fmt.Errorf("read the privileges granted to %s: %w", role, err)
	}
	type grant struct{ on, owner string }
	grants, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (grant, error) {
		var g grant
		err := row.Scan(&g.on, &g.owner)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the privileges granted to %s: %w", role, err)
	}
	var revokes, owners []string
	for _, g := range grants {
		on := g.on
		if strings.HasPrefix(on, "(") {
			on = "ALL " + on // REVOKE ALL (col, ...) ON TABLE t
		} else {
			on = "ALL ON " + on
		}
		revokes = append(revokes, fmt.Sprintf("REVOKE %s FROM %s;", on, roleID))
		if !slices.Contains(owners, g.owner) {
			owners = append(owners, g.owner)
		}
	}
	if len(revokes) > 0 {
		kept = append(kept, Leftover{What: "the privileges granted to walcount's role " + role, SQL: revokes,
			Who: "the owner of each object (" + strings.Join(owners, ", ") + "), who granted them, or a superuser"})
	}
	var ownsTables bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM unnest($1::text[]) AS name JOIN pg_class c ON c.oid = to_regclass(name)
WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user))`, tables).Scan(&ownsTables); err != nil {
		return nil, fmt.Errorf("read the owners of the tables: %w", err)
	}
	if ownsTables {
		kept = append(kept, Leftover{What: fmt.Sprintf("role %s, which owns the app's tables: it is not walcount's alone, keep it", role)})
		return kept, nil
	}
	kept = append(kept, Leftover{What: "walcount's role " + role,
		SQL: []string{"DROP ROLE " + roleID + ";"},
		Who: "a superuser (or a role with CREATEROLE and ADMIN on it), after the REVOKEs above (DROP ROLE refuses while the role still owns or holds anything, in any database), once nothing else logs in as it"})
	return kept, nil
}
