package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/internal/config"
)

// target is a counter's destination, resolved against the catalog.
type target struct {
	counter string
	// update is the chunk statement, with $1 keys (text[]) and $2 deltas.
	update string
	// reset zeroes the column (TRUNCATE of the source).
	reset string
	// intKey is true for smallint/integer/bigint keys, which sort
	// numerically.
	intKey bool
	// scale is the scale of the summed column: the buffered deltas count
	// units of 10^-scale, and update divides them back. 0 for counts and
	// integer sums.
	scale int
}

// ErrBadTarget is wrapped when a counter's target table or columns do not
// exist, or cannot hold what the counter writes into them.
var ErrBadTarget = errors.New("counter target does not exist or cannot be used")

// Base type OIDs a summed column may have.
const (
	oidInt8    = 20
	oidInt2    = 21
	oidInt4    = 23
	oidNumeric = 1700
)

// resolveTarget reads the key and column types of c's target and, for a
// sum, the scale of the summed column.
func resolveTarget(ctx context.Context, q Querier, c config.Counter) (*target, error) {
	schema, table := c.TargetTable()
	tbl := pgx.Identifier{schema, table}
	var keyType, colBase string
	var colTypmod int32
	err := q.QueryRow(ctx, `
SELECT format_type(k.atttypid, k.atttypmod),
       format_type(CASE WHEN ct.typtype = 'd' THEN ct.typbasetype ELSE c.atttypid END, NULL),
       CASE WHEN ct.typtype = 'd' THEN ct.typtypmod ELSE c.atttypmod END
FROM pg_attribute k
JOIN pg_attribute c ON c.attrelid = k.attrelid AND c.attname = $3 AND NOT c.attisdropped AND c.attnum > 0
JOIN pg_type ct ON ct.oid = c.atttypid
WHERE k.attrelid = to_regclass($1) AND k.attname = $2 AND NOT k.attisdropped AND k.attnum > 0`,
		tbl.Sanitize(), c.TargetKey, c.Column).Scan(&keyType, &colBase, &colTypmod)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("counter %s: %w: %s.%s or %s.%s", c.Name, ErrBadTarget,
			tbl.Sanitize(), c.TargetKey, tbl.Sanitize(), c.Column)
	}
	if err != nil {
		return nil, fmt.Errorf("counter %s: resolve target: %w", c.Name, err)
	}
	scale, err := resolveSumScale(ctx, q, c)
	if err != nil {
		return nil, err
	}
	if scale > 0 {
		// The column must keep every fractional digit, or each flush
		// would round and the column would drift from SUM().
		colScale := 0
		if colBase == "numeric" {
			colScale = scale // unconstrained numeric keeps everything
			if colTypmod >= 4 {
				colScale = int((((colTypmod - 4) & 0x7ff) ^ 1024) - 1024)
			}
		}
		if colScale < scale {
			return nil, fmt.Errorf("counter %s: %w: %s.%s (%s) cannot hold sums of %s with %d fractional digits; run: ALTER TABLE %s ALTER COLUMN %s TYPE numeric",
				c.Name, ErrBadTarget, tbl.Sanitize(), pgx.Identifier{c.Column}.Sanitize(), colBase, c.Sum, scale,
				tbl.Sanitize(), pgx.Identifier{c.Column}.Sanitize())
		}
	}
	col := pgx.Identifier{c.Column}.Sanitize()
	key := pgx.Identifier{c.TargetKey}.Sanitize()
	t := &target{
		counter: c.Name,
		// keyType comes from format_type, which quotes what needs quoting.
		update: fmt.Sprintf(`UPDATE %s AS t SET %s = t.%s + %s
FROM (SELECT u.k::%s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)) AS d
WHERE t.%s = d.id`, tbl.Sanitize(), col, col, deltaExpr(scale), keyType, key),
		reset: fmt.Sprintf(`UPDATE %s SET %s = 0 WHERE %s IS DISTINCT FROM 0`, tbl.Sanitize(), col, col),
		scale: scale,
	}
	switch keyType {
	case "smallint", "integer", "bigint":
		t.intKey = true
	}
	return t, nil
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

// resolveSumScale reads the declared type of c's summed column and returns
// the scale its deltas are buffered at. It applies aggregator.SumScale to
// the same type OID and modifier that pgoutput's RELATION message carries,
// so that the aggregator and the flusher agree on the unit; a domain is
// counted at scale 0 there, so a domain over numeric is refused here.
func resolveSumScale(ctx context.Context, q Querier, c config.Counter) (int, error) {
	if c.Sum == "" {
		return 0, nil
	}
	schema, table := c.SourceTable()
	src := pgx.Identifier{schema, table}.Sanitize()
	var typeOID, baseOID uint32
	var typmod int32
	var typeName string
	err := q.QueryRow(ctx, `
SELECT a.atttypid, CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END,
       a.atttypmod, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped AND a.attnum > 0`,
		src, c.Sum).Scan(&typeOID, &baseOID, &typmod, &typeName)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("counter %s: %w: sum column %s.%s does not exist", c.Name, ErrBadTarget, src, pgx.Identifier{c.Sum}.Sanitize())
	}
	if err != nil {
		return 0, fmt.Errorf("counter %s: resolve sum column: %w", c.Name, err)
	}
	fix := fmt.Sprintf("run: ALTER TABLE %s ALTER COLUMN %s TYPE numeric(12,2) (with the scale your values need)", src, pgx.Identifier{c.Sum}.Sanitize())
	switch {
	case baseOID == oidNumeric && typeOID != oidNumeric:
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s, a domain over numeric: %w; %s",
			c.Name, src, pgx.Identifier{c.Sum}.Sanitize(), typeName, aggregator.ErrUnsupportedSum, fix)
	case baseOID != oidNumeric && baseOID != oidInt2 && baseOID != oidInt4 && baseOID != oidInt8:
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s: %w; it must be smallint, integer, bigint or numeric(p,s)",
			c.Name, src, pgx.Identifier{c.Sum}.Sanitize(), typeName, aggregator.ErrUnsupportedSum)
	}
	scale, err := aggregator.SumScale(typeOID, typmod)
	if err != nil {
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s: %w; %s", c.Name, src, pgx.Identifier{c.Sum}.Sanitize(), typeName, err, fix)
	}
	return scale, nil
}
