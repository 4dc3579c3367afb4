package config

import (
	"reflect"
	"testing"

	"github.com/walcount/walcount/counter"
)

// TestWhereForms reads every form a where value may take into the
// counter's conditions.
func TestWhereForms(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]byte(`counters:
  - name: a
    source: votes
    key: post_id
    target: posts
    target_key: id
    column: n
    where:
      kind: [like, love]
      Status: { not: 3 }
      user_id: { not: null }
      tag: { not: [spam, "bot"] }
      deleted_at: null
      up: true
`), "walcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Counters[0].Conds()
	want := []counter.Cond{
		{Column: "deleted_at", Op: counter.OpIsNull},
		{Column: "kind", Op: counter.OpIn, Values: []string{"like", "love"}},
		{Column: "status", Op: counter.OpNe, Values: []string{"3"}},
		{Column: "tag", Op: counter.OpNotIn, Values: []string{"spam", "bot"}},
		{Column: "up", Op: counter.OpEq, Values: []string{"true"}},
		{Column: "user_id", Op: counter.OpNotNull},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("conditions:\n got %+v\nwant %+v", got, want)
	}
	for _, tc := range []struct {
		cond       counter.Cond
		null       bool
		text       string
		wantsMatch bool
	}{
		{want[1], false, "like", true}, {want[1], false, "meh", false}, {want[1], true, "", false},
		{want[2], false, "3", false}, {want[2], false, "4", true}, {want[2], true, "", false},
		{want[3], false, "spam", false}, {want[3], false, "ok", true}, {want[3], true, "", false},
		{want[5], true, "", false}, {want[5], false, "7", true},
	} {
		if got := tc.cond.Matches(tc.null, tc.text); got != tc.wantsMatch {
			t.Errorf("%s %s: Matches(null %v, %q) = %v, want %v (as SQL)", tc.cond.Column, tc.cond.Op, tc.null, tc.text, got, tc.wantsMatch)
		}
	}
}
