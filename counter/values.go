package counter

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/walcount/walcount/internal/operator"
)

var (
	// ErrBadValue is wrapped when a summed column does not parse, or has
	// more fractional digits than its declared scale.
	ErrBadValue = operator.NewError("bad column value")
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
	if typeOID != pgtype.NumericOID {
		return 0, nil
	}
	if typMod < 4 {
		return 0, fmt.Errorf("%w: it is numeric without a declared precision and scale", ErrUnsupportedSum)
	}
	scale := NumericScale(typMod)
	if scale < 0 {
		return 0, nil
	}
	if scale > MaxSumScale {
		return 0, fmt.Errorf("%w: its scale %d is above %d", ErrUnsupportedSum, scale, MaxSumScale)
	}
	return scale, nil
}

// NumericScale decodes the scale of numeric(p,s) from its type modifier,
// ((p << 16) | s) + 4 with s in 11 bits two's complement (numeric.c,
// make_numeric_typmod). typMod must be at least 4; -1 (no modifier) has no
// scale.
func NumericScale(typMod int32) int {
	return int((((typMod - 4) & 0x7ff) ^ 1024) - 1024)
}

// CanonicalValue rewrites a configured filter value into the text form
// pgoutput uses for the column's type, so that `true` matches "t" and
// "007" matches "7". Other types compare as written.
func CanonicalValue(typeOID uint32, v *string) *string {
	if v == nil {
		return nil
	}
	out := *v
	switch typeOID {
	case pgtype.BoolOID:
		switch strings.ToLower(strings.TrimSpace(out)) {
		case "t", "true", "yes", "on", "1", "y":
			out = "t"
		case "f", "false", "no", "off", "0", "n":
			out = "f"
		}
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		if n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err == nil {
			out = strconv.FormatInt(n, 10)
		}
	}
	return &out
}

// ParseInt parses a base-10 int64 without allocating.
func ParseInt(b []byte) (int64, error) {
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

// ParseScaled parses the text form of an integer or numeric value into an
// int64 count of 10^-scale units, exactly and without allocating:
// "12.5" at scale 2 is 1250. A value with more fractional digits than
// scale, NaN, an exponent or a result beyond int64 is ErrBadValue.
// numeric's output never has an exponent and always has exactly its
// column's scale, so only a value from a column of another scale fails.
func ParseScaled(b []byte, scale int) (int64, error) {
	if scale == 0 {
		return ParseInt(b)
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
