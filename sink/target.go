package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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
}

// ErrBadTarget is wrapped when a counter's target table or columns do not
// exist.
var ErrBadTarget = errors.New("counter target does not exist")

// resolveTarget reads the key and column types of c's target.
func resolveTarget(ctx context.Context, q Querier, c config.Counter) (*target, error) {
	schema, table := c.TargetTable()
	tbl := pgx.Identifier{schema, table}
	var keyType string
	err := q.QueryRow(ctx, `
SELECT format_type(k.atttypid, k.atttypmod)
FROM pg_attribute k
JOIN pg_attribute c ON c.attrelid = k.attrelid AND c.attname = $3 AND NOT c.attisdropped AND c.attnum > 0
WHERE k.attrelid = to_regclass($1) AND k.attname = $2 AND NOT k.attisdropped AND k.attnum > 0`,
		tbl.Sanitize(), c.TargetKey, c.Column).Scan(&keyType)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("counter %s: %w: %s.%s or %s.%s", c.Name, ErrBadTarget,
			tbl.Sanitize(), c.TargetKey, tbl.Sanitize(), c.Column)
	}
	if err != nil {
		return nil, fmt.Errorf("counter %s: resolve target: %w", c.Name, err)
	}
	col := pgx.Identifier{c.Column}.Sanitize()
	key := pgx.Identifier{c.TargetKey}.Sanitize()
	t := &target{
		counter: c.Name,
		// keyType comes from format_type, which quotes what needs quoting.
		update: fmt.Sprintf(`UPDATE %s AS t SET %s = t.%s + d.delta
FROM (SELECT u.k::%s AS id, u.delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)) AS d
WHERE t.%s = d.id`, tbl.Sanitize(), col, col, keyType, key),
		reset: fmt.Sprintf(`UPDATE %s SET %s = 0 WHERE %s IS DISTINCT FROM 0`, tbl.Sanitize(), col, col),
	}
	switch keyType {
	case "smallint", "integer", "bigint":
		t.intKey = true
	}
	return t, nil
}
