package counter

import (
	"strings"
	"testing"
)

// TestValidateMultiLevel: a chain of sums over counter columns (three
// levels) is accepted; a cycle of sums, a counter summing its own column
// and a counter column used as a key are refused.
func TestValidateMultiLevel(t *testing.T) {
	likes := Counter{Name: "post_likes", Source: "likes", Key: "post_id", Target: "posts", TargetKey: "id", Column: "likes_count"}
	users := Counter{Name: "user_likes", Source: "posts", Key: "user_id", Target: "users", TargetKey: "id", Column: "total_likes", Sum: "likes_count"}
	orgs := Counter{Name: "org_likes", Source: "users", Key: "org_id", Target: "orgs", TargetKey: "id", Column: "total_likes", Sum: "total_likes"}
	if ps := Validate([]Counter{orgs, likes, users}); len(ps) != 0 {
		t.Fatalf("a chain of three levels: %v", ps)
	}

	back := Counter{Name: "back", Source: "orgs", Key: "id", Target: "posts", TargetKey: "id", Column: "other", Sum: "total_likes"}
	// back makes posts.other, which nobody sums: still no cycle.
	if ps := Validate([]Counter{likes, users, orgs, back}); len(ps) != 0 {
		t.Fatalf("a chain back to posts into another column: %v", ps)
	}
	loop := Counter{Name: "loop", Source: "orgs", Key: "id", Target: "posts", TargetKey: "id", Column: "likes_count", Sum: "total_likes"}
	ps := Validate([]Counter{users, orgs, loop})
	if len(ps) != 1 || !strings.Contains(ps[0].Msg, "cycle (") {
		t.Fatalf("a cycle of three: %v", ps)
	}
	self := Counter{Name: "self", Source: "posts", Key: "id", Target: "posts", TargetKey: "id", Column: "n", Sum: "n"}
	if ps := Validate([]Counter{self}); len(ps) != 1 || !strings.Contains(ps[0].Msg, "(self → self)") {
		t.Fatalf("a counter summing its own column: %v", ps)
	}
	byKey := Counter{Name: "by_count", Source: "posts", Key: "likes_count", Target: "buckets", TargetKey: "id", Column: "n"}
	if ps := Validate([]Counter{likes, byKey}); len(ps) != 1 || !strings.Contains(ps[0].Msg, "only a sum may read it") {
		t.Fatalf("a counter column as a key: %v", ps)
	}
}

// TestValidateCreateMissingExtremum: a max or min counter may create
// target rows, alone or beside a count of the same target that does too;
// its defaults are checked as a count's are.
func TestValidateCreateMissingExtremum(t *testing.T) {
	newest := Counter{Name: "newest", Source: "comments", Key: "post_id", Target: "post_aggregates", TargetKey: "post_id", Column: "newest", Max: "created_at", CreateMissing: true}
	if ps := Validate([]Counter{newest}); len(ps) != 0 {
		t.Fatalf("create_missing on a max counter: %v", ps)
	}
	count := Counter{Name: "comments", Source: "comments", Key: "post_id", Target: "post_aggregates", TargetKey: "post_id", Column: "comments", CreateMissing: true}
	if ps := Validate([]Counter{newest, count}); len(ps) != 0 {
		t.Fatalf("a max beside a count, both creating the rows: %v", ps)
	}
	newest.Defaults = map[string]string{"newest": "now"}
	if ps := Validate([]Counter{newest}); len(ps) != 1 || !strings.Contains(ps[0].Msg, "counter column") {
		t.Fatalf("a default for a max counter's own column: %v", ps)
	}
}
