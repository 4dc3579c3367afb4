package counter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// ErrNotDerivable is wrapped when a summed column is generated and its
// expression is not one walcount can compute from the published columns.
// It wraps ErrBadTarget: the daemon stops on it, as check refuses it.
var ErrNotDerivable = fmt.Errorf("%w: the summed column is generated and cannot be derived from the columns the WAL carries", ErrBadTarget)

// A generated column is not in the WAL stream: pgoutput leaves generated
// columns out before PostgreSQL 18, and from 18 on publishes only STORED
// ones, and only with the publication option publish_generated_columns,
// which walcount's publication does not set. So a sum over a generated
// column is derived: walcount computes the column's expression from the
// columns the stream carries, exactly as the server computes it. The
// expressions it derives are integer arithmetic: integer columns and
// constants, +, -, *, unary minus, parentheses and casts to smallint,
// integer or bigint, a boolean column cast to an integer (true 1, false
// 0). Any other expression (a division, a function, a CASE, a numeric) is
// refused by walcount check and walcount run alike, with the reason.

// Derivation computes a generated column's value from other columns.
type Derivation struct {
	Column string // the generated column
	Expr   string // its expression, as pg_get_expr prints it
	root   *dnode
	inputs []string
}

// Inputs returns the columns the expression reads, sorted.
func (d *Derivation) Inputs() []string { return slices.Clone(d.inputs) }

type dnode struct {
	op          byte // 'c' column, 'k' constant, '+', '-', '*', 'n' negate, 'x' cast
	col         string
	isBool      bool // a boolean column (only under a cast)
	k           int64
	width       int // cast: 16, 32, 64
	left, right *dnode
}

// Derive returns how the generated column name of t is computed, or an
// error wrapping ErrNotDerivable that says why it cannot be.
func Derive(t *Table, name string) (*Derivation, error) {
	col, ok := t.Columns[name]
	if !ok || !col.Generated {
		return nil, fmt.Errorf("%s.%s is not a generated column", t.Ident(), name)
	}
	d := &Derivation{Column: name, Expr: col.GenExpr}
	if !col.IntegerBase() {
		return nil, fmt.Errorf("%w: it is %s, and walcount derives only integer expressions (GENERATED ALWAYS AS (%s))", ErrNotDerivable, col.Full, col.GenExpr)
	}
	p := &dparser{src: col.GenExpr, t: t}
	root, err := p.expr()
	if err == nil {
		p.space()
		if p.pos < len(p.src) {
			err = fmt.Errorf("unexpected %q", p.src[p.pos:])
		}
	}
	if err == nil && root.isBool {
		err = errors.New("a boolean must be cast to an integer")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: GENERATED ALWAYS AS (%s): %v; walcount derives integer columns and constants combined with +, - and *, and casts to integer types", ErrNotDerivable, col.GenExpr, err)
	}
	d.root = root
	var walk func(n *dnode)
	walk = func(n *dnode) {
		if n == nil {
			return
		}
		if n.op == 'c' && !slices.Contains(d.inputs, n.col) {
			d.inputs = append(d.inputs, n.col)
		}
		walk(n.left)
		walk(n.right)
	}
	walk(root)
	slices.Sort(d.inputs)
	return d, nil
}

// Eval computes the column from the values of its inputs: get returns an
// input's text as pgoutput sends it, null true for NULL. Any NULL input
// makes the value NULL, as in SQL.
func (d *Derivation) Eval(get func(col string) (text []byte, null bool, err error)) (int64, bool, error) {
	return d.root.eval(get)
}

func (n *dnode) eval(get func(string) ([]byte, bool, error)) (int64, bool, error) {
	switch n.op {
	case 'k':
		return n.k, false, nil
	case 'c':
		text, null, err := get(n.col)
		if err != nil || null {
			return 0, null, err
		}
		if n.isBool {
			switch string(text) {
			case "t":
				return 1, false, nil
			case "f":
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("%w: %q is not a boolean", ErrBadValue, text)
		}
		v, err := ParseInt(text)
		return v, false, err
	case 'n', 'x':
		v, null, err := n.left.eval(get)
		if err != nil || null {
			return 0, null, err
		}
		if n.op == 'n' {
			if v == math.MinInt64 {
				return 0, false, fmt.Errorf("%w: integer out of range", ErrBadValue)
			}
			return -v, false, nil
		}
		if n.width < 64 && (v < -(1<<(n.width-1)) || v >= 1<<(n.width-1)) {
			return 0, false, fmt.Errorf("%w: %d out of range for a %d-bit integer", ErrBadValue, v, n.width)
		}
		return v, false, nil
	}
	a, null, err := n.left.eval(get)
	if err != nil || null {
		return 0, null, err
	}
	b, null, err := n.right.eval(get)
	if err != nil || null {
		return 0, null, err
	}
	var r int64
	var overflow bool
	switch n.op {
	case '+':
		r = a + b
		overflow = (a > 0 && b > 0 && r < 0) || (a < 0 && b < 0 && r >= 0)
	case '-':
		r = a - b
		overflow = (a >= 0 && b < 0 && r < 0) || (a < 0 && b > 0 && r >= 0)
	case '*':
		r = a * b
		overflow = a != 0 && (r/a != b || (a == -1 && b == math.MinInt64))
	}
	if overflow {
		return 0, false, fmt.Errorf("%w: integer out of range", ErrBadValue)
	}
	return r, false, nil
}

// dparser reads the expressions pg_get_expr prints for the grammar
// Derivation documents.
type dparser struct {
	src string
	pos int
	t   *Table
}

func (p *dparser) space() {
	for p.pos < len(p.src) && (p.src[p.pos] == ' ' || p.src[p.pos] == '\n' || p.src[p.pos] == '\t') {
		p.pos++
	}
}

func (p *dparser) peek(s string) bool {
	p.space()
	return strings.HasPrefix(p.src[p.pos:], s)
}

func (p *dparser) expr() (*dnode, error) {
	left, err := p.term()
	if err != nil {
		return nil, err
	}
	for {
		var op byte
		switch {
		case p.peek("+"):
			op = '+'
		case p.peek("-"):
			op = '-'
		default:
			return left, nil
		}
		p.pos++
		right, err := p.term()
		if err != nil {
			return nil, err
		}
		if left.isBool || right.isBool {
			return nil, errors.New("a boolean must be cast to an integer")
		}
		left = &dnode{op: op, left: left, right: right}
	}
}

func (p *dparser) term() (*dnode, error) {
	left, err := p.unary()
	if err != nil {
		return nil, err
	}
	for p.peek("*") {
		p.pos++
		right, err := p.unary()
		if err != nil {
			return nil, err
		}
		if left.isBool || right.isBool {
			return nil, errors.New("a boolean must be cast to an integer")
		}
		left = &dnode{op: '*', left: left, right: right}
	}
	if p.peek("/") || p.peek("%") {
		return nil, fmt.Errorf("%q is not derived", p.src[p.pos:p.pos+1])
	}
	return left, nil
}

func (p *dparser) unary() (*dnode, error) {
	if p.peek("-") {
		p.pos++
		n, err := p.unary()
		if err != nil {
			return nil, err
		}
		if n.isBool {
			return nil, errors.New("a boolean must be cast to an integer")
		}
		return &dnode{op: 'n', left: n}, nil
	}
	n, err := p.primary()
	if err != nil {
		return nil, err
	}
	for p.peek("::") {
		p.pos += 2
		p.space()
		width, err := p.castType()
		if err != nil {
			return nil, err
		}
		// A boolean column under the cast reads as 1 or 0; the cast's
		// value is an integer.
		n = &dnode{op: 'x', left: n, width: width}
	}
	return n, nil
}

var castWidths = map[string]int{"smallint": 16, "integer": 32, "bigint": 64, "int2": 16, "int4": 32, "int8": 64, "int": 32}

func (p *dparser) castType() (int, error) {
	start := p.pos
	for p.pos < len(p.src) && (p.src[p.pos] >= 'a' && p.src[p.pos] <= 'z' || p.src[p.pos] >= '0' && p.src[p.pos] <= '9') {
		p.pos++
	}
	name := p.src[start:p.pos]
	w, ok := castWidths[name]
	if !ok {
		return 0, fmt.Errorf("a cast to %q is not derived", name)
	}
	return w, nil
}

func (p *dparser) primary() (*dnode, error) {
	p.space()
	if p.pos >= len(p.src) {
		return nil, errors.New("unexpected end")
	}
	ch := p.src[p.pos]
	switch {
	case ch == '(':
		p.pos++
		n, err := p.expr()
		if err != nil {
			return nil, err
		}
		if !p.peek(")") {
			return nil, errors.New("missing )")
		}
		p.pos++
		return n, nil
	case ch >= '0' && ch <= '9':
		start := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		if p.pos < len(p.src) && (p.src[p.pos] == '.' || p.src[p.pos] == 'e' || p.src[p.pos] == 'E') {
			return nil, errors.New("a non-integer constant is not derived")
		}
		k, err := ParseInt([]byte(p.src[start:p.pos]))
		if err != nil {
			return nil, err
		}
		return &dnode{op: 'k', k: k}, nil
	case ch == '\'':
		// A constant PostgreSQL prints quoted, '-1'::integer.
		end := strings.IndexByte(p.src[p.pos+1:], '\'')
		if end < 0 {
			return nil, errors.New("unterminated constant")
		}
		lit := p.src[p.pos+1 : p.pos+1+end]
		p.pos += end + 2
		k, err := ParseInt([]byte(lit))
		if err != nil {
			return nil, fmt.Errorf("constant %q is not an integer", lit)
		}
		if !p.peek("::") {
			return nil, fmt.Errorf("constant %q has no integer type", lit)
		}
		return &dnode{op: 'k', k: k}, nil
	case ch == '"':
		end := p.pos + 1
		var b strings.Builder
		for {
			i := strings.IndexByte(p.src[end:], '"')
			if i < 0 {
				return nil, errors.New("unterminated identifier")
			}
			b.WriteString(p.src[end : end+i])
			end += i + 1
			if end < len(p.src) && p.src[end] == '"' {
				b.WriteByte('"')
				end++
				continue
			}
			break
		}
		p.pos = end
		return p.column(b.String())
	case ch == '_' || ch >= 'a' && ch <= 'z':
		start := p.pos
		for p.pos < len(p.src) {
			c := p.src[p.pos]
			if c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
				p.pos++
				continue
			}
			break
		}
		name := p.src[start:p.pos]
		if p.peek("(") {
			return nil, fmt.Errorf("function %s() is not derived", name)
		}
		return p.column(name)
	}
	return nil, fmt.Errorf("unexpected %q", p.src[p.pos:])
}

func (p *dparser) column(name string) (*dnode, error) {
	col, ok := p.t.Columns[name]
	switch {
	case !ok:
		return nil, fmt.Errorf("%q is not a column of %s", name, p.t.Ident())
	case col.Generated:
		return nil, fmt.Errorf("column %q is generated too", name)
	case col.Domain:
		return nil, fmt.Errorf("column %q is a domain (%s)", name, col.Full)
	case col.BaseOID == pgtype.BoolOID:
		return &dnode{op: 'c', col: name, isBool: true}, nil
	case col.IntegerBase():
		return &dnode{op: 'c', col: name}, nil
	}
	return nil, fmt.Errorf("column %q is %s, not an integer", name, col.Full)
}

// ReadColumnsOf is ReadColumns with a generated summed column of t replaced
// by the columns its derivation reads (when it has one): those are what
// the stream must carry.
func (c Counter) ReadColumnsOf(t *Table) []string {
	cols := c.ReadColumns()
	if c.Sum == "" || t == nil {
		return cols
	}
	if col, ok := t.Columns[c.Sum]; !ok || !col.Generated {
		return cols
	}
	d, err := Derive(t, c.Sum)
	if err != nil {
		return cols
	}
	out := slices.DeleteFunc(cols, func(s string) bool { return s == c.Sum })
	for _, in := range d.Inputs() {
		if !slices.Contains(out, in) {
			out = append(out, in)
		}
	}
	return out
}

// Derivations returns the derivation of every counter of cs whose summed
// column is generated, by counter name. It fails as Resolve does for one
// that cannot be derived.
func Derivations(ctx context.Context, q Querier, cs []Counter) (map[string]*Derivation, error) {
	out := map[string]*Derivation{}
	for _, c := range cs {
		if c.Sum == "" {
			continue
		}
		schema, name := c.SourceTable()
		t, err := ReadTable(ctx, q, schema, name)
		if err != nil {
			return nil, fmt.Errorf("counter %s: %w", c.Name, err)
		}
		if col, ok := t.Columns[c.Sum]; !ok || !col.Generated {
			continue
		}
		d, err := Derive(t, c.Sum)
		if err != nil {
			return nil, fmt.Errorf("counter %s: sum column %s.%s: %w", c.Name, t.Ident(), c.Sum, err)
		}
		out[c.Name] = d
	}
	return out, nil
}
