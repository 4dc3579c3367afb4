package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/internal/config"
)

// counterSQL holds a counter's reconcile statements, resolved against the
// catalog. Keys travel as text, in the text form pgoutput uses, which is
// also the form of the Redis fields.
type counterSQL struct {
	name string
	// scan lists target keys after $1 (text, or NULL for the start) in key
	// order, at most $2 of them.
	scan string
	// truth returns (key, true value) for the keys in $1 (text[]).
	truth string
	// column returns (key, cached value) for the keys in $1 (text[]).
	column string
	// total counts the target rows.
	total string
	// filterArgs are the where values, bound after $1 in truth.
	filterArgs []any
}

func typeOf(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table pgx.Identifier, col string) (typ string, typmod int32, err error) {
	err = q.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod), atttypmod FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped`, table.Sanitize(), col).Scan(&typ, &typmod)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, fmt.Errorf("column %s of %s does not exist", col, table.Sanitize())
	}
	return typ, typmod, err
}

func resolveCounter(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, c config.Counter) (*counterSQL, error) {
	ss, st := c.SourceTable()
	ts, tt := c.TargetTable()
	src, tgt := pgx.Identifier{ss, st}, pgx.Identifier{ts, tt}
	keyType, _, err := typeOf(ctx, q, src, c.Key)
	if err != nil {
		return nil, fmt.Errorf("counter %s: %w", c.Name, err)
	}
	tkeyType, _, err := typeOf(ctx, q, tgt, c.TargetKey)
	if err != nil {
		return nil, fmt.Errorf("counter %s: %w", c.Name, err)
	}
	if _, _, err := typeOf(ctx, q, tgt, c.Column); err != nil {
		return nil, fmt.Errorf("counter %s: %w", c.Name, err)
	}
	key := pgx.Identifier{c.Key}.Sanitize()
	tkey := pgx.Identifier{c.TargetKey}.Sanitize()
	col := pgx.Identifier{c.Column}.Sanitize()
	value := "count(*)"
	scale := 0
	if c.Sum != "" {
		_, sumTypmod, err := typeOf(ctx, q, src, c.Sum)
		if err != nil {
			return nil, fmt.Errorf("counter %s: %w", c.Name, err)
		}
		var oid uint32
		if err := q.QueryRow(ctx, `SELECT atttypid FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2`, src.Sanitize(), c.Sum).Scan(&oid); err != nil {
			return nil, fmt.Errorf("counter %s: read type of %s: %w", c.Name, c.Sum, err)
		}
		// The aggregator's unit: the same scale, from the same rule.
		if scale, err = aggregator.SumScale(oid, sumTypmod); err != nil {
			return nil, fmt.Errorf("counter %s: %w", c.Name, err)
		}
		value = fmt.Sprintf("coalesce(sum(s.%s), 0)", pgx.Identifier{c.Sum}.Sanitize())
	}
	scaled := func(expr string) string {
		if scale == 0 {
			return fmt.Sprintf("(%s)::bigint", expr)
		}
		return fmt.Sprintf("round((%s) * 1e%d)::bigint", expr, scale)
	}
	var where []string
	var args []any
	for _, name := range slices.Sorted(maps.Keys(c.Where)) {
		v := c.Where[name]
		id := "s." + pgx.Identifier{name}.Sanitize()
		if v == nil {
			where = append(where, id+" IS NULL")
			continue
		}
		typ, _, err := typeOf(ctx, q, src, name)
		if err != nil {
			return nil, fmt.Errorf("counter %s: %w", c.Name, err)
		}
		args = append(args, *v)
		where = append(where, fmt.Sprintf("%s = CAST($%d::text AS %s)", id, len(args)+1, typ))
	}
	filter := ""
	if len(where) > 0 {
		filter = " AND " + strings.Join(where, " AND ")
	}
	return &counterSQL{
		name: c.Name,
		scan: fmt.Sprintf(`SELECT t.%s::text FROM %s t WHERE $1::text IS NULL OR t.%s > CAST($1::text AS %s) ORDER BY t.%s LIMIT $2`,
			tkey, tgt.Sanitize(), tkey, tkeyType, tkey),
		truth: fmt.Sprintf(`SELECT s.%s::text, %s FROM %s s WHERE s.%s = ANY (CAST($1::text[] AS %s[]))%s GROUP BY s.%s`,
			key, scaled(value), src.Sanitize(), key, keyType, filter, key),
		column: fmt.Sprintf(`SELECT t.%s::text, %s FROM %s t WHERE t.%s = ANY (CAST($1::text[] AS %s[]))`,
			tkey, scaled("coalesce(t."+col+", 0)"), tgt.Sanitize(), tkey, tkeyType),
		total:      fmt.Sprintf(`SELECT count(*) FROM %s`, tgt.Sanitize()),
		filterArgs: args,
	}, nil
}
