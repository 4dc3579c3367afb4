package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/walcount/walcount/cdc"
)

// CheckOwnerSteps says which steps of walcount setup need the owner of the
// tables, and whether the current role is it.
const CheckOwnerSteps = "owner_steps"

// checkOwnerSteps says up front what only the owner of the tables may do
// (CREATE or ALTER PUBLICATION needs the ownership of every table in it,
// walcount.messages included; REPLICA IDENTITY needs that of the source)
// and whether the current role may: a role with every GRANT it needs can
// still not create the publication. When it may not and the publication
// does not exist, it names the owner's way: the SQL of walcount setup
// --print-sql, run once by the owner, who must be a member of walcount's
// role to publish walcount's table of messages.
func (r *run) checkOwnerSteps() error {
	var schemas, names []string
	seen := map[string]bool{}
	for _, c := range r.cfg.Counters {
		for _, name := range []string{c.Source, c.Target} {
			if seen[name] {
				continue
			}
			seen[name] = true
			t, err := r.lookupTable(name)
			if err != nil {
				return r.queryFailed(CheckOwnerSteps, "the tables of the counters", err)
			}
			if t.Exists {
				schemas, names = append(schemas, t.Schema), append(names, t.Name)
			}
		}
	}
	if len(names) == 0 {
		return nil // the table checks report them missing
	}
	ms, mn := splitTable(cdc.MessageTable)
	rows, err := r.conn.Query(r.ctx, `
SELECT quote_ident(t.s) || '.' || quote_ident(t.n), o.rolname::text,
       pg_has_role(current_user, c.relowner, 'USAGE'),
       pg_has_role(c.relowner, current_user, 'USAGE') OR (t.s = $3 AND t.n = $4)
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(s, n, i)
JOIN pg_namespace ns ON ns.nspname = t.s
JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n
JOIN pg_roles o ON o.oid = c.relowner
ORDER BY t.i`, append(schemas, ms), append(names, mn), ms, mn)
	if err != nil {
		return r.queryFailed(CheckOwnerSteps, "the owners of the tables", err)
	}
	var owned, notOwned, owners, nonMembers []string
	sawMessages := false
	for rows.Next() {
		var name, owner string
		var owns, member bool
		if err := rows.Scan(&name, &owner, &owns, &member); err != nil {
			rows.Close()
			return r.queryFailed(CheckOwnerSteps, "the owners of the tables", err)
		}
		if name == cdc.MessageTable {
			sawMessages = true
		}
		entry := fmt.Sprintf("%s (owned by %s)", name, owner)
		if owns {
			owned = append(owned, entry)
			continue
		}
		notOwned = append(notOwned, entry)
		if !slices.Contains(owners, owner) {
			owners = append(owners, owner)
			if !member {
				nonMembers = append(nonMembers, owner)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return r.queryFailed(CheckOwnerSteps, "the owners of the tables", err)
	}
	var pubOwner string
	var ownsPub, pubExists bool
	err = r.conn.QueryRow(r.ctx, `SELECT o.rolname::text, pg_has_role(current_user, p.pubowner, 'USAGE')
FROM pg_publication p JOIN pg_roles o ON o.oid = p.pubowner WHERE p.pubname = $1`, r.cfg.Publication).Scan(&pubOwner, &ownsPub)
	switch {
	case errNoRows(err):
	case err != nil:
		return r.queryFailed(CheckOwnerSteps, "the owner of publication "+r.cfg.Publication, err)
	default:
		pubExists = true
	}

	all := append(slices.Clone(owned), notOwned...)
	if !sawMessages {
		all = append(all, cdc.MessageTable+" (which setup creates, owned by the role that runs it)")
	}
	steps := fmt.Sprintf("steps that need the owner of the tables: CREATE or ALTER PUBLICATION %s needs the ownership of %s; setup --fix-replica-identity needs that of each source it fixes",
		r.ident(r.cfg.Publication), strings.Join(all, ", "))
	role := r.ident(r.user)
	switch {
	case len(notOwned) == 0 && (!pubExists || ownsPub):
		r.ok(CheckOwnerSteps, fmt.Sprintf("%s; role %s owns them: walcount setup does them itself", steps, r.user))
	case pubExists:
		r.ok(CheckOwnerSteps, fmt.Sprintf("%s; role %s is not the owner of them all, and publication %s exists (owned by %s): walcount setup leaves it alone when it holds exactly what walcount needs (the publication check says whether it does)",
			steps, r.user, r.cfg.Publication, pubOwner))
	default:
		fix := "run walcount setup --print-sql with this configuration and have the owner run its output once with psql -v ON_ERROR_STOP=1 -f, then walcount setup"
		if len(nonMembers) > 0 {
			var grants []string
			for _, o := range nonMembers {
				grants = append(grants, fmt.Sprintf("GRANT %s TO %s;", role, r.ident(o)))
			}
			fix = fmt.Sprintf("as a superuser (or a role with ADMIN on %s): %s (the owner publishes walcount.messages, which %s owns, and hands the publication over to it); then %s",
				role, strings.Join(grants, " "), r.user, fix)
		}
		r.warn(CheckOwnerSteps, fmt.Sprintf("%s; role %s is not the owner of %s: walcount setup cannot create the publication", steps, r.user, strings.Join(stripOwners(notOwned), ", ")), fix)
	}
	return nil
}

// stripOwners drops the " (owned by …)" of each entry.
func stripOwners(entries []string) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i], _, _ = strings.Cut(e, " (owned by ")
	}
	return out
}

// splitTable splits a canonical "schema.table" name.
func splitTable(name string) (string, string) {
	s, t, _ := strings.Cut(name, ".")
	return s, t
}
