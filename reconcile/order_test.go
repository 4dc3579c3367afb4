package reconcile

import (
	"slices"
	"testing"

	"github.com/walcount/walcount/counter"
)

// TestBackfillOrder: a counter comes after the counters it is computed
// from (the counters of its via table, a level below), whatever the
// order of the configuration; the level above a via counter to backfill
// is added; the others keep the configuration's order.
func TestBackfillOrder(t *testing.T) {
	cs := counter.ExpandThrough([]counter.Counter{
		{Name: "community_score", Source: "public.posts", Key: "community_id", Target: "public.communities", TargetKey: "id", Column: "score", Sum: "score"},
		{Name: "post_votes", Source: "public.votes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "votes"},
		{Name: "user_karma", Source: "public.votes", Key: "post_id", Target: "public.users", TargetKey: "id", Column: "karma", Sum: "score",
			Through: &counter.Through{Table: "public.posts", Key: "id", Column: "user_id"}},
		{Name: "post_score", Source: "public.votes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "score", Sum: "score"},
	})
	all := make([]string, len(cs))
	for i, c := range cs {
		all[i] = c.Name
	}
	got := BackfillOrder(cs, all)
	want := []string{"post_votes", "post_score", "community_score", "user_karma__via_total", "user_karma__via_target", "user_karma__via_where", "user_karma"}
	if !slices.Equal(got, want) {
		t.Fatalf("order of every counter:\n got %v\nwant %v", got, want)
	}
	// One via counter alone brings its level above; a name no counter
	// has stays at the end.
	got = BackfillOrder(cs, []string{"gone", "user_karma__via_where"})
	if want := []string{"user_karma__via_where", "user_karma", "gone"}; !slices.Equal(got, want) {
		t.Fatalf("order of a via counter: got %v, want %v", got, want)
	}
	// Quiet corrections only when the level above comes after.
	via, _ := counterNamed(cs, "user_karma__via_total")
	for _, tc := range []struct {
		run  RunInfo
		want string
	}{
		{RunInfo{Kind: "backfill", Counters: want}, "user_karma"},
		{RunInfo{Kind: "backfill", Counters: []string{"user_karma", "user_karma__via_total"}}, ""},
		{RunInfo{Kind: "backfill", Counters: []string{"user_karma__via_total"}}, ""},
		{RunInfo{Kind: "backfill", Counters: want, DryRun: true}, ""},
		{RunInfo{Kind: "manual", Counters: want}, ""},
	} {
		if got := quietAbove(&tc.run, via); got != tc.want {
			t.Errorf("quietAbove(%+v) = %q, want %q", tc.run, got, tc.want)
		}
	}
}

// TestBackfillOrderCreatingCounter: a counter that creates target rows
// comes after what the other counters of its target are computed from
// (here user_karma's via table), since its seed fills their columns in
// the rows it creates; declared first, it would otherwise go first.
func TestBackfillOrderCreatingCounter(t *testing.T) {
	cs := counter.ExpandThrough([]counter.Counter{
		{Name: "user_votes", Source: "public.votes", Key: "voter_id", Target: "public.users", TargetKey: "id", Column: "votes", CreateMissing: true},
		{Name: "post_votes", Source: "public.votes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "votes"},
		{Name: "user_karma", Source: "public.votes", Key: "post_id", Target: "public.users", TargetKey: "id", Column: "karma", Sum: "score",
			Through: &counter.Through{Table: "public.posts", Key: "id", Column: "user_id"}},
		{Name: "post_stats", Source: "public.votes", Key: "post_id", Target: "public.stats", TargetKey: "post_id", Column: "votes", CreateMissing: true},
	})
	all := make([]string, len(cs))
	for i, c := range cs {
		all[i] = c.Name
	}
	got := BackfillOrder(cs, all)
	want := []string{"post_votes", "post_stats", "user_karma__via_total", "user_karma__via_target", "user_karma__via_where", "user_votes", "user_karma"}
	if !slices.Equal(got, want) {
		t.Fatalf("order:\n got %v\nwant %v", got, want)
	}
}

func counterNamed(cs []counter.Counter, name string) (counter.Counter, bool) {
	for _, c := range cs {
		if c.Name == name {
			return c, true
		}
	}
	return counter.Counter{}, false
}
