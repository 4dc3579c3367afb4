package counter

import "testing"

func TestSplitTable(t *testing.T) {
	tests := []struct{ in, schema, table, canonical string }{
		{"likes", "public", "likes", "public.likes"},
		{"Likes", "public", "likes", "public.likes"},
		{"Shop.Orders", "shop", "orders", "shop.orders"},
		{`"Shop"."Orders"`, "Shop", "Orders", `"Shop"."Orders"`},
		{`public."a.b"`, "public", "a.b", `public."a.b"`},
		{`"say ""hi"""`, "public", `say "hi"`, `public."say ""hi"""`},
		{"t$1", "public", "t$1", "public.t$1"},
		{"_x", "public", "_x", "public._x"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			s, tb := SplitTable(tt.in)
			if s != tt.schema || tb != tt.table {
				t.Fatalf("SplitTable(%q) = %q, %q; want %q, %q", tt.in, s, tb, tt.schema, tt.table)
			}
			if c := CanonicalTable(s, tb); c != tt.canonical {
				t.Errorf("canonical form = %q, want %q", c, tt.canonical)
			}
			if s2, t2 := SplitTable(tt.canonical); s2 != s || t2 != tb {
				t.Errorf("SplitTable(canonical %q) = %q, %q", tt.canonical, s2, t2)
			}
		})
	}
	for _, bad := range []string{"", "a.", ".a", "a b", `"a"b`, `""`, "a.b.c", "1a", `"x`} {
		if _, _, err := parseTable(bad); err == nil {
			t.Errorf("parseTable(%q) accepted a bad name", bad)
		}
	}
}
