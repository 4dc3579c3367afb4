package counter

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
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

	// The flush statement (DESIGN §2): one round trip per chunk of keys,
	// sorted by the caller so two flushes never lock rows in opposite
	// orders.
	r.Flush = fmt.Sprintf(`UPDATE %s AS t SET %s = t.%s + %s
FROM (SELECT u.k::%s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)) AS d
WHERE t.%s = d.id`, tgt.Ident(), col, col, deltaExpr(r.Scale), tkey.Full, tkeyID)
	r.Reset = fmt.Sprintf(`UPDATE %s SET %s = 0 WHERE %s IS DISTINCT FROM 0`, tgt.Ident(), col, col)

	value := "count(*)"
	if c.Sum != "" {
		value = fmt.Sprintf("coalesce(sum(s.%s), 0)", pgx.Identifier{c.Sum}.Sanitize())
	}
	scaled := func(expr string) string {
		if r.Scale == 0 {
			return fmt.Sprintf("(%s)::bigint", expr)
		}
		return fmt.Sprintf("round((%s) * 1e%d)::bigint", expr, r.Scale)
	}
	var where []string
	r.FilterArgs = nil
	for _, name := range sortedKeys(c.Where) {
		v := c.Where[name]
		id := "s." + pgx.Identifier{name}.Sanitize()
		if v == nil {
			where = append(where, id+" IS NULL")
			continue
		}
		wcol, ok := src.Columns[name]
		if !ok {
			return fmt.Errorf("counter %s: %w: where column %s.%s does not exist", c.Name, ErrBadTarget, src.Ident(), pgx.Identifier{name}.Sanitize())
		}
		r.FilterArgs = append(r.FilterArgs, *v)
		where = append(where, fmt.Sprintf("%s = CAST($%d::text AS %s)", id, len(r.FilterArgs)+1, wcol.Full))
	}
	filter := ""
	if len(where) > 0 {
		filter = " AND " + strings.Join(where, " AND ")
	}
	r.Scan = fmt.Sprintf(`SELECT t.%s::text FROM %s t WHERE $1::text IS NULL OR t.%s > CAST($1::text AS %s) ORDER BY t.%s LIMIT $2`,
		tkeyID, tgt.Ident(), tkeyID, tkey.Full, tkeyID)
	r.Truth = fmt.Sprintf(`SELECT s.%s::text, %s FROM %s s WHERE s.%s = ANY (CAST($1::text[] AS %s[]))%s GROUP BY s.%s`,
		keyID, scaled(value), src.Ident(), keyID, key.Full, filter, keyID)
	r.Column = fmt.Sprintf(`SELECT t.%s::text, %s FROM %s t WHERE t.%s = ANY (CAST($1::text[] AS %s[]))`,
		tkeyID, scaled("coalesce(t."+col+", 0)"), tgt.Ident(), tkeyID, tkey.Full)
	r.Total = fmt.Sprintf(`SELECT count(*) FROM %s`, tgt.Ident())
	return nil
}

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
