package counter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func connect(t *testing.T, schema string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.Database(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	return conn
}

// TestTargetKeyTypes applies deltas through the generated statement to
// targets keyed by each supported key type.
func TestTargetKeyTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		keyType string
		keys    []string
	}{
		{"smallint", []string{"1", "2", "32767"}},
		{"integer", []string{"-5", "7", "2147483647"}},
		{"bigint", []string{"1", "9007199254740993", "9223372036854775807"}},
		{"uuid", []string{"0b9f1e7c-3c1d-4c59-9d53-0c9a4f0a8a01", "6f1c9d4e-0000-4000-8000-000000000002", "ffffffff-ffff-4fff-bfff-ffffffffffff"}},
		{"text", []string{"hello-world", "ünïcödé", "with:colon and space"}},
		{"character varying(40)", []string{"a", "b", "c"}},
	}
	for _, tc := range tests {
		t.Run(tc.keyType, func(t *testing.T) {
			t.Parallel()
			conn := connect(t, appschema.SQL(appschema.Options{KeyType: tc.keyType}))
			ctx := context.Background()
			for _, k := range tc.keys {
				if _, err := conn.Exec(ctx, "INSERT INTO posts (id) VALUES ($1::text::"+tc.keyType+")", k); err != nil {
					t.Fatal(err)
				}
			}
			c := Default()
			tgt, err := Resolve(ctx, conn, c)
			if err != nil {
				t.Fatal(err)
			}
			wantInt := tc.keyType == "smallint" || tc.keyType == "integer" || tc.keyType == "bigint"
			if tgt.IntKey != wantInt {
				t.Errorf("intKey = %v, want %v", tgt.IntKey, wantInt)
			}
			// The last key has no row: its delta is dropped, not an error.
			keys := append(append([]string(nil), tc.keys...), missingKey(tc.keyType))
			deltas := []int64{3, -2, 1, 5}
			rows, err := conn.Query(ctx, tgt.Flush, keys, deltas)
			if err != nil {
				t.Fatalf("update: %v", err)
			}
			type notHit struct {
				Key             string
				Present, Locked bool
			}
			res, err := pgx.CollectRows(rows, pgx.RowToStructByPos[notHit])
			if err != nil {
				t.Fatalf("update: %v", err)
			}
			var missed []string
			for _, n := range res {
				if n.Present || n.Locked {
					t.Errorf("key %q not updated, though its row exists (present %v, locked %v)", n.Key, n.Present, n.Locked)
				}
				missed = append(missed, n.Key)
			}
			if len(missed) != 1 || missed[0] != keys[3] {
				t.Errorf("keys that hit no row = %q, want [%q]", missed, keys[3])
			}
			for i, k := range tc.keys {
				var got int64
				if err := conn.QueryRow(ctx, "SELECT likes_count FROM posts WHERE id = $1::text::"+tc.keyType, k).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != deltas[i] {
					t.Errorf("likes_count of %s = %d, want %d", k, got, deltas[i])
				}
			}
		})
	}
}

func missingKey(keyType string) string {
	switch keyType {
	case "uuid":
		return "00000000-0000-4000-8000-000000000000"
	case "smallint", "integer", "bigint":
		return "12345"
	}
	return "nobody"
}

// TestTargetNumericSum checks that buffered units of 10^-scale are divided
// back exactly, and that columns that would round are refused.
func TestTargetNumericSum(t *testing.T) {
	t.Parallel()
	schema := `
CREATE DOMAIN money2 AS numeric(12,2);
CREATE DOMAIN points AS integer;
` + appschema.SQL(appschema.Options{
		PostsColumns: "weight numeric(14,2) NOT NULL DEFAULT 0, weight_any numeric NOT NULL DEFAULT 0, " +
			"weight_1 numeric(14,1) NOT NULL DEFAULT 0, weight_9 numeric(30,9) NOT NULL DEFAULT 0",
		LikesColumns: "w2 numeric(12,2), w9 numeric(18,9), w0 numeric(10,0), wneg numeric(5,-2), wi integer, ws smallint, wb bigint, " +
			"wfree numeric, w10 numeric(20,10), wdom money2, wpoints points, wfloat double precision",
		Posts: 2})
	conn := connect(t, schema)
	ctx := context.Background()
	counter := func(sum, column string) Counter {
		c := Default()
		c.Name, c.Sum, c.Column = "w", sum, column
		return c
	}
	good := []struct {
		sum, column string
		scale       int
		deltas      []int64
		want        string // the column of post 1 after the deltas
	}{
		{"w2", "weight", 2, []int64{1250, -1}, "12.49"},
		{"w2", "weight_any", 2, []int64{-1}, "-0.01"},
		{"w9", "weight_9", 9, []int64{1, 1234567891}, "1.234567892"},
		{"w0", "weight", 0, []int64{12}, "24.49"},
		{"wneg", "likes_count", 0, []int64{300}, "300"},
		{"wi", "likes_count", 0, []int64{5}, "305"},
		{"ws", "weight_1", 0, []int64{7}, "7.0"},
		{"wb", "weight_any", 0, []int64{2}, "1.99"},
		{"w2", "weight_any", 2, []int64{1}, "2.00"},
		{"wpoints", "likes_count", 0, []int64{-5}, "300"},
	}
	for _, tc := range good {
		tgt, err := Resolve(ctx, conn, counter(tc.sum, tc.column))
		if err != nil {
			t.Errorf("sum %s into %s: %v", tc.sum, tc.column, err)
			continue
		}
		if tgt.Scale != tc.scale {
			t.Errorf("sum %s: scale = %d, want %d", tc.sum, tgt.Scale, tc.scale)
		}
		for _, d := range tc.deltas {
			if _, err := conn.Exec(ctx, tgt.Flush, []string{"1"}, []int64{d}); err != nil {
				t.Fatalf("sum %s into %s: %v\n%s", tc.sum, tc.column, err, tgt.Flush)
			}
		}
		var got string
		if err := conn.QueryRow(ctx, "SELECT "+pgx.Identifier{tc.column}.Sanitize()+"::text FROM posts WHERE id = 1").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("sum %s into %s: column = %s, want %s", tc.sum, tc.column, got, tc.want)
		}
	}

	bad := []struct {
		sum, column string
		is          error
		msg         string
	}{
		{"wfree", "weight_any", ErrUnsupportedSum, `ALTER TABLE "public"."likes" ALTER COLUMN "wfree" TYPE numeric(12,2)`},
		{"w10", "weight_any", ErrUnsupportedSum, "scale 10 is above 9"},
		{"wdom", "weight_any", ErrUnsupportedSum, "a domain over numeric"},
		{"wfloat", "weight_any", ErrUnsupportedSum, "double precision"},
		{"w2", "likes_count", ErrBadTarget, `"public"."posts"."likes_count" (bigint) cannot hold sums of w2 with 2 fractional digits`},
		{"w2", "weight_1", ErrBadTarget, "cannot hold sums of w2 with 2 fractional digits"},
		{"w9", "weight", ErrBadTarget, "with 9 fractional digits"},
		{"nope", "weight", ErrBadTarget, `sum column "public"."likes"."nope" does not exist`},
	}
	for _, tc := range bad {
		_, err := Resolve(ctx, conn, counter(tc.sum, tc.column))
		if !errors.Is(err, tc.is) || !strings.Contains(fmtErr(err), tc.msg) {
			t.Errorf("sum %s into %s: err = %v; want %v containing %q", tc.sum, tc.column, err, tc.is, tc.msg)
		}
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestDeltaExpr(t *testing.T) {
	t.Parallel()
	for scale, want := range map[int]string{0: "d.delta", 1: "d.delta * 0.1", 2: "d.delta * 0.01", 9: "d.delta * 0.000000001"} {
		if got := deltaExpr(scale); got != want {
			t.Errorf("deltaExpr(%d) = %q, want %q", scale, got, want)
		}
	}
}
