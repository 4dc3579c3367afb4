package counter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/walcount/walcount/internal/operator"
)

// ErrBadTarget is wrapped when a counter's tables or columns do not exist,
// or cannot hold what the counter writes into them.
var ErrBadTarget = operator.NewError("counter target does not exist or cannot be used")

// Querier runs queries; *pgx.Conn, *pgxpool.Pool and pgx.Tx fit.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Table is what the catalog says about one table.
type Table struct {
	Schema, Name string
	// Exists is false when no relation has that name; the fields below
	// are then zero.
	Exists bool
	OID    uint32
	// Kind is pg_class.relkind: r (table), p (partitioned table), v, m, f...
	Kind string
	// ReplIdent is pg_class.relreplident: d, f, i or n.
	ReplIdent string
	// Columns maps each live column's name to its facts.
	Columns map[string]Column
	// Identity lists the columns of the replica identity for DEFAULT (the
	// primary key) and USING INDEX; it is nil for FULL, NOTHING, and a
	// DEFAULT without a primary key.
	Identity []string
}

// IdentityUsable reports whether UPDATEs and DELETEs of the table can be
// published: PostgreSQL refuses them on a published table whose replica
// identity carries nothing.
func (t *Table) IdentityUsable() bool { return t.ReplIdent == "f" || len(t.Identity) > 0 }

// GeneratedInIdentity returns the generated columns the replica identity
// holds, sorted: under FULL every generated column, else those of the
// identity's index. virtual are the VIRTUAL ones (PostgreSQL 18+).
func (t *Table) GeneratedInIdentity() (stored, virtual []string) {
	for name, c := range t.Columns {
		if !c.Generated || (t.ReplIdent != "f" && !slices.Contains(t.Identity, name)) {
			continue
		}
		if c.Virtual {
			virtual = append(virtual, name)
		} else {
			stored = append(stored, name)
		}
	}
	slices.Sort(stored)
	slices.Sort(virtual)
	return stored, virtual
}

// Ident returns the table's name as a quoted SQL identifier.
func (t *Table) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Column is what the catalog says about one column.
type Column struct {
	// Base is the type with domains resolved and without modifiers, as
	// format_type writes it: integer, character varying, numeric.
	Base string
	// Full is the declared type with modifiers, usable in a CAST.
	Full string
	// TypeOID and TypMod are the declared type and modifier, as pgoutput's
	// RELATION message sends them. Domain is true when the type is a
	// domain; BaseOID and BaseTypMod are then the domain's base type and
	// modifier, else the same as TypeOID and TypMod.
	TypeOID    uint32
	TypMod     int32
	Domain     bool
	BaseOID    uint32
	BaseTypMod int32
	NotNull    bool
	Generated  bool
	// Virtual is true for a VIRTUAL generated column (PostgreSQL 18+),
	// which no publication can carry.
	Virtual bool
	// GenExpr is a generated column's expression, as pg_get_expr prints
	// it.
	GenExpr string
	// HasDefault is true when an INSERT that leaves the column out gives
	// it a value: a DEFAULT, an identity or a generated column.
	HasDefault bool
	// Unique is true when a valid unique index, not partial and not on an
	// expression, has the column as its only key column: ON CONFLICT on
	// the column can use it.
	Unique bool
}

// IntegerBase reports whether the column's base type is smallint, integer
// or bigint.
func (c Column) IntegerBase() bool {
	switch c.BaseOID {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		return true
	}
	return false
}

// ReadTable reads the catalog facts of schema.name in two queries, whatever
// the number of columns. A table that does not exist is not an error:
// Exists is false.
func ReadTable(ctx context.Context, q Querier, schema, name string) (*Table, error) {
	t := &Table{Schema: schema, Name: name}
	err := q.QueryRow(ctx, `
SELECT c.oid, c.relkind::text, c.relreplident::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, schema, name).Scan(&t.OID, &t.Kind, &t.ReplIdent)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return t, nil
	case err != nil:
		return nil, fmt.Errorf("look up table %s: %w", t.Ident(), err)
	}
	t.Exists = true
	t.Columns = map[string]Column{}
	rows, err := q.Query(ctx, `
SELECT a.attname,
       format_type(CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE a.atttypid END, NULL),
       format_type(a.atttypid, a.atttypmod),
       a.atttypid, a.atttypmod, ty.typtype = 'd',
       CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE a.atttypid END,
       CASE WHEN ty.typtype = 'd' THEN ty.typtypmod ELSE a.atttypmod END,
       a.attnotnull, a.attgenerated <> '', a.attgenerated = 'v',
       coalesce(CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END, ''),
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '',
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indisvalid
               AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum AND i.indpred IS NULL AND i.indexprs IS NULL)
FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`, t.OID)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", t.Ident(), err)
	}
	var col string
	var c Column
	_, err = pgx.ForEachRow(rows, []any{&col, &c.Base, &c.Full, &c.TypeOID, &c.TypMod, &c.Domain, &c.BaseOID, &c.BaseTypMod, &c.NotNull, &c.Generated, &c.Virtual, &c.GenExpr, &c.HasDefault, &c.Unique}, func() error {
		t.Columns[col] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", t.Ident(), err)
	}
	if t.ReplIdent == "d" || t.ReplIdent == "i" {
		cond := "i.indisprimary"
		if t.ReplIdent == "i" {
			cond = "i.indisreplident"
		}
		err := q.QueryRow(ctx, `
SELECT array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND `+cond, t.OID).Scan(&t.Identity)
		if err != nil {
			return nil, fmt.Errorf("read replica identity of %s: %w", t.Ident(), err)
		}
	}
	return t, nil
}

// Resolved is a counter bound to the catalog: the types and scales of its
// columns and every statement that reads or writes it. It is immutable.
type Resolved struct {
	Counter Counter
	// Scale is the declared scale of the summed column: buffered deltas
	// count units of 10^-Scale (0 for counts and integer sums).
	Scale int
	// IntKey is true for integer target keys, which sort numerically.
	IntKey bool
	// Extremum is set for a max or min counter: its deltas only count the
	// changes of each key (always positive), and Flush sets the column of
	// every key it is given from the source's current rows instead of
	// adding them.
	Extremum bool
	// FlushArgs are bound after Flush's $1 and $2 (an extremum's filter
	// values).
	FlushArgs []any
	// Flush adds deltas: $1 keys (text[]), $2 deltas (bigint[]), to the
	// rows it can lock at once. It returns the keys (of $1) it did not
	// update, each with whether a row has it (present) and whether the
	// statement locked that row (see buildSQL).
	Flush string
	// Correct adds corrections, $1 keys (text[]) and $2 deltas (bigint[]),
	// to the rows that have the keys, waiting for their row locks, and
	// returns the keys (of $1) that have no row. Only for walcount's own
	// tables (a backfill's corrections of a via table, which no app
	// transaction locks; reconcile's correctVia). An extremum's sets
	// the column from the source rows instead (its corrections are
	// recomputes), its filter values bound after $2 (FlushArgs).
	Correct string
	// Reset zeroes the column (a TRUNCATE of the source) of the rows it
	// can lock at once, and returns (key, column in delta units) of the
	// rows another transaction holds.
	Reset string
	// Scan lists target keys after $1 (text, NULL for the start) in key
	// order, at most $2 of them.
	Scan string
	// Truth returns (key, true value) for the keys in $1 (text[]), with
	// FilterArgs bound after $1.
	Truth      string
	FilterArgs []any
	// Column returns (key, cached value) for the keys in $1 (text[]) of
	// the slot $2: the column plus the delta walcount.carried holds for
	// the key.
	Column string
	// Total counts the target rows.
	Total string
	// Seed, for a create_missing counter other than a via table's, gives
	// every key with counted source rows (with a value, for a max or min)
	// a target row when it has none: the key, the counter column's empty
	// value (0, or NULL for a max or min) and the declared defaults, ON
	// CONFLICT DO NOTHING, with FilterArgs bound from $1. It returns the
	// keys of the rows it created. A full reconciliation, a backfill
	// among them, measures the target rows there are, so it seeds first
	// (see buildSeed).
	Seed string
	// Fill sets the column of the target rows with the keys $1 (text[])
	// to the value of their source rows now, FilterArgs bound after $1
	// (see buildFill).
	Fill string
	// Read is a fresh read's statement (docs/design.md §7): one snapshot
	// with, for each key of $1 (text[]) of the slot $2, in order: the
	// slot's checkpoint W (text), whether a target row has the key, the
	// column in delta units (an extremum's: its text), the delta
	// walcount.carried holds for the key, whether the key (or the whole
	// counter) is marked dirty, and for an extremum the value of its
	// source rows now (text). FilterArgs are bound after $2.
	Read string
	// The survey of a range of keys, with FilterArgs bound after $1 and
	// $2 and the slot after them (see buildSurvey).
	SurveyIntKeys                                        bool
	SurveyFirst, SurveyNext, SurveyBounds, SurveyCompare string
}

// Resolve reads the catalog facts of c's source and target tables once and
// returns c bound to them. It fails with ErrBadTarget when a table or
// column is missing or the counter column cannot hold the sums, and with
// ErrUnsupportedSum when the summed column cannot be summed exactly.
func Resolve(ctx context.Context, q Querier, c Counter) (*Resolved, error) {
	ss, st := c.SourceTable()
	ts, tt := c.TargetTable()
	src, err := ReadTable(ctx, q, ss, st)
	if err != nil {
		return nil, fmt.Errorf("counter %s: %w", c.Name, err)
	}
	tgt := src
	if ts != ss || tt != st {
		if tgt, err = ReadTable(ctx, q, ts, tt); err != nil {
			return nil, fmt.Errorf("counter %s: %w", c.Name, err)
		}
	}
	return bind(c, src, tgt)
}

// bind checks c against the catalog facts and builds its statements.
func bind(c Counter, src, tgt *Table) (*Resolved, error) {
	tkey, okKey := tgt.Columns[c.TargetKey]
	col, okCol := tgt.Columns[c.Column]
	if !okKey || !okCol {
		return nil, fmt.Errorf("counter %s: %w: %s.%s or %s.%s", c.Name, ErrBadTarget,
			tgt.Ident(), c.TargetKey, tgt.Ident(), c.Column)
	}
	key, ok := src.Columns[c.Key]
	if c.Keyless() {
		key, ok = tkey, true // the constant key is of the target key's type
	}
	if !ok {
		return nil, fmt.Errorf("counter %s: %w: key column %s.%s does not exist", c.Name, ErrBadTarget, src.Ident(), pgx.Identifier{c.Key}.Sanitize())
	}
	if s, ok := src.Columns[c.Sum]; ok && c.IsVia() && c.Through.Role == RoleTarget && !s.IntegerBase() {
		return nil, fmt.Errorf("counter %s: %w: via column %s.%s is %s: the column naming the target through a parent must be smallint, integer or bigint",
			c.Through.Counter, ErrBadTarget, src.Ident(), pgx.Identifier{c.Sum}.Sanitize(), s.Full)
	}
	scale, err := sumScale(c, src)
	if err != nil {
		return nil, err
	}
	if s, ok := src.Columns[c.Sum]; ok && s.Generated {
		if _, err := Derive(src, c.Sum); err != nil {
			return nil, fmt.Errorf("counter %s: sum column %s.%s: %w", c.Name, src.Ident(), pgx.Identifier{c.Sum}.Sanitize(), err)
		}
	}
	if scale > 0 {
		// The column must keep every fractional digit, or each flush
		// would round and the column would drift from SUM().
		colScale := 0
		if col.Base == "numeric" {
			colScale = scale // unconstrained numeric keeps everything
			if col.BaseTypMod >= 4 {
				colScale = NumericScale(col.BaseTypMod)
			}
		}
		if colScale < scale {
			colName := pgx.Identifier{c.Column}.Sanitize()
			return nil, fmt.Errorf("counter %s: %w: %s.%s (%s) cannot hold sums of %s with %d fractional digits; run: ALTER TABLE %s ALTER COLUMN %s TYPE numeric",
				c.Name, ErrBadTarget, tgt.Ident(), colName, col.Base, c.Sum, scale, tgt.Ident(), colName)
		}
	}
	if err := ExtremumTypes(c, src, tgt); err != nil {
		return nil, err
	}
	if c.CreateMissing {
		if err := createMissingProblem(c, tgt); err != nil {
			return nil, err
		}
	}
	r := &Resolved{Counter: c, Scale: scale, IntKey: tkey.IntegerBase() && !tkey.Domain}
	if err := r.buildSQL(src, tgt, key, tkey); err != nil {
		return nil, err
	}
	return r, nil
}

// ErrUnsupportedExtremum is wrapped when an extremum counter's column is
// of a type walcount does not keep the max or min of, or its counter
// column cannot hold the values.
var ErrUnsupportedExtremum = operator.NewError("the max or min column cannot be kept")

// ExtremumBase reports whether a column of base type oid can be the max
// or min column of a counter: integers, numeric, date, timestamp and
// timestamptz.
func ExtremumBase(oid uint32) bool {
	switch oid {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.NumericOID,
		pgtype.DateOID, pgtype.TimestampOID, pgtype.TimestamptzOID:
		return true
	}
	return false
}

// ExtremumTypes checks the types of an extremum counter: the max or min
// column is one ExtremumBase accepts, and the counter column has the same
// base type (or both are integers). A counter that is no extremum passes.
func ExtremumTypes(c Counter, src, tgt *Table) error {
	v, fn := c.Extremum()
	if v == "" {
		return nil
	}
	vID := pgx.Identifier{v}.Sanitize()
	s, ok := src.Columns[v]
	if !ok {
		return fmt.Errorf("counter %s: %w: %s column %s.%s does not exist", c.Name, ErrBadTarget, fn, src.Ident(), vID)
	}
	if s.Generated {
		return fmt.Errorf("counter %s: %w: %s column %s.%s is a generated column, which PostgreSQL before 18 does not publish; keep the %s of a stored column",
			c.Name, ErrUnsupportedExtremum, fn, src.Ident(), vID, fn)
	}
	if !ExtremumBase(s.BaseOID) {
		return fmt.Errorf("counter %s: %w: %s column %s.%s is %s; it must be smallint, integer, bigint, numeric, date, timestamp or timestamptz",
			c.Name, ErrUnsupportedExtremum, fn, src.Ident(), vID, s.Full)
	}
	col := tgt.Columns[c.Column]
	if col.BaseOID != s.BaseOID && !(col.IntegerBase() && s.IntegerBase()) {
		colID := pgx.Identifier{c.Column}.Sanitize()
		return fmt.Errorf("counter %s: %w: %s.%s is %s but the %s column %s.%s is %s; run: ALTER TABLE %s ALTER COLUMN %s TYPE %s",
			c.Name, ErrUnsupportedExtremum, tgt.Ident(), colID, col.Full, fn, src.Ident(), vID, s.Full, tgt.Ident(), colID, s.Base)
	}
	return nil
}

// sumScale returns the scale c's summed column is buffered at (0 without a
// sum). It applies SumScale to the type OID and modifier that pgoutput's
// RELATION message carries, so that the aggregator and the flusher agree on
// the unit; a domain is counted at scale 0 there, so a domain over numeric
// is refused here.
func sumScale(c Counter, src *Table) (int, error) {
	if c.Sum == "" {
		return 0, nil
	}
	sumName := pgx.Identifier{c.Sum}.Sanitize()
	s, ok := src.Columns[c.Sum]
	if !ok {
		return 0, fmt.Errorf("counter %s: %w: sum column %s.%s does not exist", c.Name, ErrBadTarget, src.Ident(), sumName)
	}
	fix := fmt.Sprintf("run: ALTER TABLE %s ALTER COLUMN %s TYPE numeric(12,2) (with the scale your values need)", src.Ident(), sumName)
	switch {
	case s.BaseOID == pgtype.NumericOID && s.Domain:
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s, a domain over numeric: %w; %s",
			c.Name, src.Ident(), sumName, s.Full, ErrUnsupportedSum, fix)
	case s.BaseOID == pgtype.BoolOID && s.Domain:
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s, a domain over boolean: %w; use the column's own boolean type",
			c.Name, src.Ident(), sumName, s.Full, ErrUnsupportedSum)
	case s.BaseOID == pgtype.BoolOID:
		return 0, nil // true counts +1, false -1
	case s.BaseOID != pgtype.NumericOID && !s.IntegerBase():
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s: %w; it must be smallint, integer, bigint, numeric(p,s) or boolean",
			c.Name, src.Ident(), sumName, s.Full, ErrUnsupportedSum)
	}
	scale, err := SumScale(s.TypeOID, s.TypMod)
	if err != nil {
		return 0, fmt.Errorf("counter %s: sum column %s.%s is %s: %w; %s", c.Name, src.Ident(), sumName, s.Full, err, fix)
	}
	return scale, nil
}

// ErrCannotCreate is wrapped when a create_missing counter's target row
// cannot be created: no unique index for ON CONFLICT on the target key, a
// NOT NULL column without a value, or a default naming no column.
var ErrCannotCreate = fmt.Errorf("%w: its target rows cannot be created", ErrBadTarget)

// createMissingProblem reports why the flush could not create c's target
// rows, nil when it can. walcount check reports the same with fixes.
func createMissingProblem(c Counter, tgt *Table) error {
	if tk := tgt.Columns[c.TargetKey]; !tk.Unique {
		return fmt.Errorf("counter %s: %w: %s.%s has no unique index or constraint of its own, which INSERT ... ON CONFLICT needs",
			c.Name, ErrCannotCreate, tgt.Ident(), pgx.Identifier{c.TargetKey}.Sanitize())
	}
	for _, name := range sortedKeys(c.Defaults) {
		col, ok := tgt.Columns[name]
		if !ok {
			return fmt.Errorf("counter %s: %w: create_missing default for %s.%s, which does not exist",
				c.Name, ErrCannotCreate, tgt.Ident(), pgx.Identifier{name}.Sanitize())
		}
		if col.Generated {
			return fmt.Errorf("counter %s: %w: create_missing default for %s.%s, a generated column",
				c.Name, ErrCannotCreate, tgt.Ident(), pgx.Identifier{name}.Sanitize())
		}
	}
	if missing := MissingDefaults(c, tgt); len(missing) > 0 {
		return fmt.Errorf("counter %s: %w: NOT NULL columns of %s without a default need one in create_missing.defaults: %s",
			c.Name, ErrCannotCreate, tgt.Ident(), strings.Join(missing, ", "))
	}
	return nil
}

// MissingDefaults returns the NOT NULL columns of tgt, sorted, that a row
// created for c would leave NULL: no DEFAULT and no value in c.Defaults.
// The target key and the counter column get values of their own.
func MissingDefaults(c Counter, tgt *Table) []string {
	var out []string
	for _, name := range sortedKeys(tgt.Columns) {
		col := tgt.Columns[name]
		if !col.NotNull || col.HasDefault || name == c.TargetKey || name == c.Column {
			continue
		}
		if _, ok := c.Defaults[name]; ok {
			continue
		}
		out = append(out, name)
	}
	return out
}
