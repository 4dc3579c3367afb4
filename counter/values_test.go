package counter

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// numericTypmod is the type modifier of numeric(p,s).
func numericTypmod(p, s int) int32 { return int32(p<<16|s&0x7ff) + 4 }

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "42": 42, "-42": -42, "+7": 7, "9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63} {
		got, err := ParseInt([]byte(in))
		if err != nil || got != want {
			t.Errorf("ParseInt(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-", "1.0", "abc", "9223372036854775808", "12345678901234567890"} {
		if _, err := ParseInt([]byte(in)); err == nil {
			t.Errorf("ParseInt(%q): no error", in)
		}
	}
}

func TestSumScale(t *testing.T) {
	tests := []struct {
		name    string
		oid     uint32
		typmod  int32
		want    int
		refused bool
	}{
		{"bigint", pgtype.Int8OID, -1, 0, false},
		{"integer", pgtype.Int4OID, -1, 0, false},
		{"smallint", pgtype.Int2OID, -1, 0, false},
		{"numeric(12,2)", pgtype.NumericOID, numericTypmod(12, 2), 2, false},
		{"numeric(10,0)", pgtype.NumericOID, numericTypmod(10, 0), 0, false},
		{"numeric(18,9)", pgtype.NumericOID, numericTypmod(18, 9), 9, false},
		{"numeric(5,-2)", pgtype.NumericOID, numericTypmod(5, -2), 0, false},
		{"numeric", pgtype.NumericOID, -1, 0, true},
		{"numeric(20,10)", pgtype.NumericOID, numericTypmod(20, 10), 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SumScale(tc.oid, tc.typmod)
			if tc.refused {
				if !errors.Is(err, ErrUnsupportedSum) || !errors.Is(err, ErrBadValue) {
					t.Fatalf("SumScale = %d, %v; want ErrUnsupportedSum", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("SumScale = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParseScaled(t *testing.T) {
	good := []struct {
		in    string
		scale int
		want  int64
	}{
		{"12.5", 2, 1250},
		{"12.50", 2, 1250},
		{"12", 2, 1200},
		{"12.", 2, 1200},
		{".5", 2, 50},
		{"0.01", 2, 1},
		{"-0.01", 2, -1},
		{"-12.34", 2, -1234},
		{"+3.1", 1, 31},
		{"0.000000001", 9, 1},
		{"0.00", 2, 0},
		{"-0.00", 2, 0},
		{"42", 0, 42},
		{"92233720368547758.07", 2, 1<<63 - 1},
		{"-92233720368547758.08", 2, -1 << 63},
		{"9223372036.854775807", 9, 1<<63 - 1},
	}
	for _, tc := range good {
		got, err := ParseScaled([]byte(tc.in), tc.scale)
		if err != nil || got != tc.want {
			t.Errorf("ParseScaled(%q, %d) = %d, %v; want %d", tc.in, tc.scale, got, err, tc.want)
		}
	}
	bad := []struct {
		in    string
		scale int
	}{
		{"12.345", 2}, // more digits than the scale
		{"12.500", 2}, // even zeros: the column's own scale never has them
		{"1.5", 0},
		{"", 2},
		{"-", 2},
		{".", 2},
		{"1..2", 2},
		{"1.2.3", 2},
		{"NaN", 2},
		{"Infinity", 2},
		{"1e5", 2},
		{"1,5", 2},
		{" 1", 2},
		{"92233720368547758.08", 2},
		{"-92233720368547758.09", 2},
		{"99999999999999999999999", 2},
		{"1", 10},
	}
	for _, tc := range bad {
		if got, err := ParseScaled([]byte(tc.in), tc.scale); !errors.Is(err, ErrBadValue) {
			t.Errorf("ParseScaled(%q, %d) = %d, %v; want ErrBadValue", tc.in, tc.scale, got, err)
		}
	}
}

func TestParseScaledDoesNotAllocate(t *testing.T) {
	in := []byte("-1234567.89")
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseScaled(in, 2) }); n != 0 {
		t.Fatalf("parseScaled allocates %.0f times per call", n)
	}
}
