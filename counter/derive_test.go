package counter

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestDeriveMatchesServer derives generated columns from the catalog and
// compares each derived value with the one the server stored, over rows
// that include NULLs, negatives and booleans; expressions walcount cannot
// compute are refused with the reason.
func TestDeriveMatchesServer(t *testing.T) {
	t.Parallel()
	conn := connect(t, `
CREATE TABLE votes (id bigint PRIMARY KEY, up integer, down integer, big bigint, s smallint, liked boolean, note text,
  score integer GENERATED ALWAYS AS (up - down) STORED,
  weighted bigint GENERATED ALWAYS AS (2 * up - 3 * (down + s) + big) STORED,
  sign integer GENERATED ALWAYS AS ((liked)::integer * 2 - 1) STORED,
  neg integer GENERATED ALWAYS AS (-up + -1) STORED,
  "Odd" integer GENERATED ALWAYS AS (up::smallint * 1) STORED,
  halved integer GENERATED ALWAYS AS (up / 2) STORED,
  len integer GENERATED ALWAYS AS (length(note)) STORED,
  frac numeric(10,2) GENERATED ALWAYS AS (up * 1.5) STORED);
INSERT INTO votes (id, up, down, big, s, liked, note) VALUES
  (1, 3, 1, 10, 2, true, 'a'), (2, -7, 4, -9000000000, -3, false, 'bb'), (3, NULL, 1, 1, 1, NULL, NULL),
  (4, 0, 0, 0, 0, true, ''), (5, 21474, -2147483, 9000000000, 32767, false, 'x');`)
	ctx := context.Background()
	tbl, err := ReadTable(ctx, conn, "public", "votes")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"score", "weighted", "sign", "neg", "Odd"} {
		d, err := Derive(tbl, name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		rows, err := conn.Query(ctx, `SELECT up::text, down::text, big::text, s::text, CASE liked WHEN true THEN 't' WHEN false THEN 'f' END, "`+name+`"::text FROM votes ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var up, down, big, s, liked, want *string
			if err := rows.Scan(&up, &down, &big, &s, &liked, &want); err != nil {
				t.Fatal(err)
			}
			vals := map[string]*string{"up": up, "down": down, "big": big, "s": s, "liked": liked}
			got, null, err := d.Eval(func(col string) ([]byte, bool, error) {
				v, ok := vals[col]
				if !ok {
					t.Fatalf("%s reads %q, not an input", name, col)
				}
				if v == nil {
					return nil, true, nil
				}
				return []byte(*v), false, nil
			})
			switch {
			case err != nil:
				t.Errorf("%s = %s: %v", name, d.Expr, err)
			case want == nil && !null:
				t.Errorf("%s = %s: derived %d, server NULL", name, d.Expr, got)
			case want != nil && (null || *want != itoa(got)):
				t.Errorf("%s = %s: derived %d (null %v), server %s", name, d.Expr, got, null, *want)
			}
		}
		rows.Close()
		t.Logf("%s: %s, inputs %v", name, d.Expr, d.Inputs())
	}
	for name, why := range map[string]string{"halved": `"/" is not derived`, "len": "function length() is not derived", "frac": "derives only integer expressions"} {
		_, err := Derive(tbl, name)
		if !errors.Is(err, ErrNotDerivable) || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: err = %v, want ErrNotDerivable saying %q", name, err, why)
		}
	}
	c := Counter{Key: "id", Sum: "weighted"}
	if got := strings.Join(c.ReadColumnsOf(tbl), ","); got != "id,big,down,s,up" {
		t.Errorf("ReadColumnsOf = %s, want the key and the derivation's inputs", got)
	}
}

func itoa(n int64) string {
	var b [24]byte
	i := len(b)
	neg := n < 0
	u := uint64(n)
	if neg {
		u = -u
	}
	for {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
