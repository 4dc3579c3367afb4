package aggregator

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/config"
)

var (
	// ErrNotAttributable is wrapped when a change lacks a column a counter
	// needs: the replica identity does not carry it, or it arrived as an
	// unchanged TOASTed value with no old value to stand in for it.
	ErrNotAttributable = errors.New("change cannot be attributed to a counter key")
	// ErrBadValue is wrapped when a summed column does not parse, or has
	// more fractional digits than its declared scale.
	ErrBadValue = errors.New("bad column value")
	// ErrUnsupportedSum is wrapped when a summed column's type cannot be
	// summed exactly in int64: numeric without a declared scale, or with a
	// scale above MaxSumScale. It wraps ErrBadValue, so a daemon that stops
	// on bad values stops on it too.
	ErrUnsupportedSum = fmt.Errorf("%w: the summed column cannot be summed exactly", ErrBadValue)
)

// MaxSumScale is the largest declared scale of a numeric summed column.
// Deltas are int64 in units of 10^-scale: at scale 9 a counter still holds
// sums up to about 9.2 billion.
const MaxSumScale = 9

// rule is a counter bound to one version of its source relation.
type rule struct {
	counter string
	key     int // column index of the key
	sum     int // column index of the summed column, or -1
	// scale is the declared scale of the summed column: its values are
	// counted in units of 10^-scale (0 for integer columns).
	scale int
	where []filter
	// cols lists every column the rule reads, for identity checks.
	cols []int
	// changed counts changes per operation (walcount_changes_total).
	changed [4]prometheus.Counter
}

type filter struct {
	col   int
	value *string // nil: IS NULL
}

// contribution is what one row adds to a counter.
type contribution struct {
	ok     bool
	key    []byte
	amount int64
}

// bindRules binds the counters whose source is rel to rel's columns. It
// fails with ErrNotAttributable when a needed column is missing (dropped or
// renamed while walcount streams), or when the replica identity does not
// carry it and old rows could therefore not be attributed (DESIGN §2 rule
// 11); with ErrUnsupportedSum when the summed column has no exact scale.
func bindRules(rel *cdc.Relation, counters []config.Counter) ([]rule, error) {
	var out []rule
	for _, c := range counters {
		if !sourceIs(c, rel) {
			continue
		}
		r := rule{counter: c.Name, key: rel.ColumnIndex(c.Key), sum: -1}
		if r.key < 0 {
			return nil, fmt.Errorf("counter %s: %w: key column %q is not in %s", c.Name, ErrNotAttributable, c.Key, rel.QualifiedName())
		}
		r.cols = append(r.cols, r.key)
		if c.Sum != "" {
			if r.sum = rel.ColumnIndex(c.Sum); r.sum < 0 {
				return nil, fmt.Errorf("counter %s: %w: sum column %q is not in %s", c.Name, ErrNotAttributable, c.Sum, rel.QualifiedName())
			}
			r.cols = append(r.cols, r.sum)
			scale, err := SumScale(rel.Columns[r.sum].TypeOID, rel.Columns[r.sum].TypMod)
			if err != nil {
				return nil, fmt.Errorf("counter %s: sum column %q of %s: %w; run: ALTER TABLE %s ALTER COLUMN %s TYPE numeric(12,2) (with the scale your values need)",
					c.Name, c.Sum, rel.QualifiedName(), err, rel.QualifiedName(), pgx.Identifier{c.Sum}.Sanitize())
			}
			r.scale = scale
		}
		for col, v := range c.Where {
			i := rel.ColumnIndex(col)
			if i < 0 {
				return nil, fmt.Errorf("counter %s: %w: where column %q is not in %s", c.Name, ErrNotAttributable, col, rel.QualifiedName())
			}
			r.where = append(r.where, filter{col: i, value: canonicalValue(rel.Columns[i].TypeOID, v)})
			r.cols = append(r.cols, i)
		}
		if rel.ReplicaIdentity != 'f' {
			for _, i := range r.cols {
				if !rel.Columns[i].Key {
					return nil, fmt.Errorf("counter %s: %w: column %q of %s is not in its replica identity; run: ALTER TABLE %s REPLICA IDENTITY FULL",
						c.Name, ErrNotAttributable, rel.Columns[i].Name, rel.QualifiedName(), rel.QualifiedName())
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// sourceIs reports whether c counts rows of rel.
func sourceIs(c config.Counter, rel *cdc.Relation) bool {
	schema, table := c.SourceTable()
	return schema == rel.Namespace && table == rel.Name
}

// Type OIDs whose text form walcount canonicalises in filters or sums.
const (
	oidBool    = 16
	oidInt8    = 20
	oidInt2    = 21
	oidInt4    = 23
	oidNumeric = 1700
)

// SumScale returns the scale at which a summed column of the given type
// is counted: 0 for integers, s for numeric(p,s). The type modifier of
// numeric(p,s) is ((p << 16) | s) + 4, s in 11 bits two's complement
// (numeric.c, make_numeric_typmod; negative scales exist from
// PostgreSQL 15 on and round to tens, hundreds...: their values are
// integers, counted at scale 0); -1 means no modifier. An unconstrained numeric, or a scale above
// MaxSumScale, is refused with ErrUnsupportedSum: its values could carry
// any number of fractional digits, which no fixed int64 scale holds.
//
// Other type OIDs (a domain over an integer type, say) are counted at
// scale 0; their values must then be integers. The sink resolves the
// scale from the catalog with the same rule and refuses what this
// function cannot vouch for, so both sides agree.
func SumScale(typeOID uint32, typMod int32) (int, error) {
	if typeOID != oidNumeric {
		return 0, nil
	}
	if typMod < 4 {
		return 0, fmt.Errorf("%w: it is numeric without a declared precision and scale", ErrUnsupportedSum)
	}
	scale := int((((typMod - 4) & 0x7ff) ^ 1024) - 1024)
	if scale < 0 {
		return 0, nil
	}
	if scale > MaxSumScale {
		return 0, fmt.Errorf("%w: its scale %d is above %d", ErrUnsupportedSum, scale, MaxSumScale)
	}
	return scale, nil
}

// canonicalValue rewrites a configured filter value into the text form
// pgoutput uses for the column's type, so that `true` matches "t" and
// "007" matches "7". Other types compare as written.
func canonicalValue(typeOID uint32, v *string) *string {
	if v == nil {
		return nil
	}
	out := *v
	switch typeOID {
	case oidBool:
		switch strings.ToLower(strings.TrimSpace(out)) {
		case "t", "true", "yes", "on", "1", "y":
			out = "t"
		case "f", "false", "no", "off", "0", "n":
			out = "f"
		}
	case oidInt2, oidInt4, oidInt8:
		if n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err == nil {
			out = strconv.FormatInt(n, 10)
		}
	}
	return &out
}

// value returns column i of t, standing in the same column of alt for an
// unchanged TOASTed value (the value did not change, so alt has it).
func value(t, alt cdc.Tuple, i int) (cdc.Value, error) {
	if i >= len(t.Cols) {
		return cdc.Value{}, fmt.Errorf("%w: tuple has %d columns, need %d", ErrNotAttributable, len(t.Cols), i+1)
	}
	v := t.Cols[i]
	if v.Kind == cdc.ValueUnchangedToast {
		if i < len(alt.Cols) && alt.Cols[i].Kind != cdc.ValueUnchangedToast {
			return alt.Cols[i], nil
		}
		return v, fmt.Errorf("%w: column %d is an unchanged TOASTed value", ErrNotAttributable, i+1)
	}
	return v, nil
}

// contribute computes what row t contributes to r. alt is the other image
// of the same row (old for new and vice versa), used for unchanged TOASTed
// values.
func (r *rule) contribute(t, alt cdc.Tuple) (contribution, error) {
	if !t.Present() {
		return contribution{}, nil
	}
	for _, f := range r.where {
		v, err := value(t, alt, f.col)
		if err != nil {
			return contribution{}, err
		}
		if f.value == nil {
			if v.Kind != cdc.ValueNull {
				return contribution{}, nil
			}
		} else if v.Kind != cdc.ValueText || string(v.Data) != *f.value {
			return contribution{}, nil
		}
	}
	k, err := value(t, alt, r.key)
	if err != nil {
		return contribution{}, err
	}
	if k.Kind == cdc.ValueNull {
		return contribution{}, nil // a row with no target counts nowhere
	}
	c := contribution{ok: true, key: k.Data, amount: 1}
	if r.sum >= 0 {
		s, err := value(t, alt, r.sum)
		if err != nil {
			return contribution{}, err
		}
		if s.Kind == cdc.ValueNull {
			c.amount = 0
		} else if c.amount, err = parseScaled(s.Data, r.scale); err != nil {
			return contribution{}, err
		}
	}
	return c, nil
}

// parseInt parses a base-10 int64 without allocating.
func parseInt(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: empty number", ErrBadValue)
	}
	neg := b[0] == '-'
	if neg || b[0] == '+' {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, fmt.Errorf("%w: %q is not a 64-bit integer", ErrBadValue, b)
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q is not an integer", ErrBadValue, b)
		}
		n = n*10 + uint64(c-'0')
	}
	if n > 1<<63-1+boolU(neg) {
		return 0, fmt.Errorf("%w: %q overflows int64", ErrBadValue, b)
	}
	if neg {
		return -int64(n), nil
	}
	return int64(n), nil
}

// pow10 holds 10^0 .. 10^MaxSumScale.
var pow10 = [MaxSumScale + 1]uint64{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}

// parseScaled parses the text form of an integer or numeric value into an
// int64 count of 10^-scale units, exactly and without allocating:
// "12.5" at scale 2 is 1250. A value with more fractional digits than
// scale, NaN, an exponent or a result beyond int64 is ErrBadValue.
// numeric's output never has an exponent and always has exactly its
// column's scale, so only a value from a column of another scale fails.
func parseScaled(b []byte, scale int) (int64, error) {
	if scale == 0 {
		return parseInt(b)
	}
	if scale < 0 || scale > MaxSumScale {
		return 0, fmt.Errorf("%w: scale %d out of range", ErrBadValue, scale)
	}
	in := b
	neg := len(b) > 0 && b[0] == '-'
	if len(b) > 0 && (b[0] == '-' || b[0] == '+') {
		b = b[1:]
	}
	var n uint64
	digits, frac := 0, -1 // frac counts digits after '.', -1 before it
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			if frac >= 0 {
				if frac == scale {
					return 0, fmt.Errorf("%w: %q has more than %d fractional digits", ErrBadValue, in, scale)
				}
				frac++
			}
			if n > (1<<64-1)/10 {
				return 0, fmt.Errorf("%w: %q overflows int64 at scale %d", ErrBadValue, in, scale)
			}
			n = n*10 + uint64(c-'0')
			digits++
		case c == '.' && frac < 0:
			frac = 0
		default:
			return 0, fmt.Errorf("%w: %q is not a decimal number", ErrBadValue, in)
		}
	}
	if digits == 0 {
		return 0, fmt.Errorf("%w: %q is not a decimal number", ErrBadValue, in)
	}
	if frac < 0 {
		frac = 0
	}
	// Scale up the digits after the point that were not written.
	m := pow10[scale-frac]
	if n > (1<<64-1)/m {
		return 0, fmt.Errorf("%w: %q overflows int64 at scale %d", ErrBadValue, in, scale)
	}
	n *= m
	if n > 1<<63-1+boolU(neg) {
		return 0, fmt.Errorf("%w: %q overflows int64 at scale %d", ErrBadValue, in, scale)
	}
	if neg {
		return -int64(n), nil
	}
	return int64(n), nil
}

func boolU(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
