package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/walcount/walcount/counter"
)

// checkIdentity checks design rule 11: the old row of an UPDATE or
// DELETE reaches walcount only as the source table's replica identity. Under
// REPLICA IDENTITY DEFAULT that is the primary key, so a DELETE from a likes
// table keyed by id says "id 7 is gone" but not which post it liked. Every
// column a counter reads from the old row (key, sum, where) must therefore
// be in the identity, or the change cannot be turned into a delta.
//
// When the identity columns are unchanged by an UPDATE, pgoutput omits the
// old row altogether; the new row then carries their (unchanged) values,
// which is why containing the columns is enough.
//
// A partitioned source table is decoded per partition, with each
// partition's own identity, so each leaf partition is checked.
func (r *run) checkIdentity(c counter.Counter, src *table, prefix string) error {
	needed := c.ReadColumnsOf(src.Table)
	if c.AppendOnly {
		// An event log needs no identity: its UPDATEs and DELETEs are
		// not counted (they mark the counter dirty). One finding per
		// table for all its append_only counters.
		if r.once["append_only "+src.sql] {
			return nil
		}
		r.once["append_only "+src.sql] = true
		if !src.IdentityUsable() {
			r.ok(CheckReplicaIdentity, fmt.Sprintf("%s%s is append_only: it needs no replica identity (it has none, so PostgreSQL refuses UPDATEs and DELETEs of it while it is published, which an append-only table does not take)", prefix, src.sql))
			return nil
		}
		r.ok(CheckReplicaIdentity, fmt.Sprintf("%s%s is append_only: its replica identity need not carry the counter's columns (an UPDATE or DELETE that reaches walcount marks the counter dirty)", prefix, src.sql))
		return nil
	}

	type rel struct {
		oid            uint32
		sql, replident string
	}
	rels := []rel{{src.OID, src.sql, src.ReplIdent}}
	if src.Kind == "p" {
		rels = nil
		rows, err := r.conn.Query(r.ctx, `
SELECT c.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relreplident::text
FROM pg_partition_tree($1::regclass) p
JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.isleaf ORDER BY 2`, src.OID)
		if err != nil {
			return r.queryFailed(CheckReplicaIdentity, prefix+"partitions of "+src.sql, err)
		}
		for rows.Next() {
			var p rel
			if err := rows.Scan(&p.oid, &p.sql, &p.replident); err != nil {
				rows.Close()
				return r.queryFailed(CheckReplicaIdentity, prefix+"partitions of "+src.sql, err)
			}
			rels = append(rels, p)
		}
		if err := rows.Err(); err != nil {
			return r.queryFailed(CheckReplicaIdentity, prefix+"partitions of "+src.sql, err)
		}
	}

	for _, t := range rels {
		cols, desc, err := r.identityColumns(t.oid, t.replident)
		if err != nil {
			return r.queryFailed(CheckReplicaIdentity, prefix+"replica identity of "+t.sql, err)
		}
		var missing []string
		for _, n := range needed {
			if cols != nil && !slices.Contains(cols, n) || cols == nil && t.replident != "f" {
				missing = append(missing, r.ident(n))
			}
		}
		if len(missing) == 0 {
			msg := fmt.Sprintf("%sreplica identity of %s is %s", prefix, t.sql, desc)
			if t.replident == "f" {
				if idx, err := r.smallerIdentity(t.oid, needed); err == nil && idx != "" {
					msg += fmt.Sprintf("; unique index %s holds every column the counters read, so a smaller identity would do: "+
						"ALTER TABLE %s REPLICA IDENTITY USING INDEX %s; makes each UPDATE and DELETE log, and the walsender decode and send, "+
						"only those columns of the old row", r.ident(idx), t.sql, r.ident(idx))
				}
			}
			r.ok(CheckReplicaIdentity, msg)
			continue
		}
		list := strings.Join(missing, ", ")
		r.problem(CheckReplicaIdentity,
			fmt.Sprintf("%sreplica identity of %s is %s, which does not contain %s: its UPDATEs and DELETEs cannot be attributed "+
				"(or create a unique index containing %s and use REPLICA IDENTITY USING INDEX)", prefix, t.sql, desc, list, list),
			fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;", t.sql))
	}
	return nil
}

// identityColumns returns the columns of a relation's replica identity and
// a description of it. cols is nil for FULL (every counter.Column) and for an
// identity that carries nothing.
func (r *run) identityColumns(oid uint32, replident string) (cols []string, desc string, err error) {
	var cond string
	switch replident {
	case "f":
		return nil, "FULL", nil
	case "n":
		return nil, "NOTHING", nil
	case "d":
		cond = "i.indisprimary"
	case "i":
		cond = "i.indisreplident"
	default:
		return nil, "", fmt.Errorf("unknown relreplident %q", replident)
	}
	var index string
	err = r.conn.QueryRow(r.ctx, `
SELECT ic.relname, array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND `+cond+`
GROUP BY ic.relname`, oid).Scan(&index, &cols)
	if errNoRows(err) {
		if replident == "d" {
			// Without a primary key DEFAULT carries nothing.
			return nil, "DEFAULT without a primary key (no old values at all)", nil
		}
		return nil, "USING INDEX of a dropped index (no old values at all)", nil
	}
	if err != nil {
		return nil, "", err
	}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = r.ident(c)
	}
	if replident == "d" {
		return cols, fmt.Sprintf("DEFAULT, the primary key (%s)", strings.Join(quoted, ", ")), nil
	}
	return cols, fmt.Sprintf("USING INDEX %s (%s)", r.ident(index), strings.Join(quoted, ", ")), nil
}

// smallerIdentity returns a unique index of the relation that could be its
// replica identity (not partial, no expression, immediate, valid, every
// column NOT NULL) and contains every column in needed, the one with the
// fewest columns; "" when there is none.
func (r *run) smallerIdentity(oid uint32, needed []string) (string, error) {
	var name string
	err := r.conn.QueryRow(r.ctx, `
SELECT ic.relname
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate AND i.indisvalid
  AND i.indpred IS NULL AND i.indexprs IS NULL
  AND NOT EXISTS (SELECT FROM unnest(i.indkey::int2[]) k(attnum)
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE NOT a.attnotnull)
  AND (SELECT array_agg(a.attname::text) FROM unnest(i.indkey::int2[]) k(attnum)
       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) @> $2::text[]
ORDER BY i.indnatts, ic.relname LIMIT 1`, oid, needed).Scan(&name)
	if errNoRows(err) {
		return "", nil
	}
	return name, err
}
