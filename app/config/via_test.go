package config

import (
	"strings"
	"testing"

	"github.com/walcount/walcount/counter"
)

// TestLoadVia reads a counter through a parent and expands it: the
// declared counter becomes the level above its via table (the sum of
// total by target where passes = 1) and the via table's three counters
// follow every declared counter; what via cannot express is refused with
// the field.
func TestLoadVia(t *testing.T) {
	const good = `counters:
  - {name: likes_of_post, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - name: karma
    source: votes
    key: post_id
    where: {hidden: false}
    via: {table: Posts, key: ID, column: creator_id, where: {deleted: false, state: [open, locked]}}
    target: users
    target_key: id
    column: karma
    sum: score
    create_missing: true
`
	cfg, err := Load(writeFile(t, good), mapEnv(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cfg.Counters {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, " "); got != "likes_of_post karma karma__via_total karma__via_target karma__via_where" {
		t.Fatalf("counters %s", got)
	}
	top, total, target, passes := cfg.Counters[1], cfg.Counters[2], cfg.Counters[3], cfg.Counters[4]
	if top.Source != "walcount.via_karma" || top.Key != "target" || top.Sum != "total" || *top.Where["passes"] != "1" ||
		top.Target != "public.users" || !top.CreateMissing || top.Through.Table != "public.posts" || top.IsVia() {
		t.Errorf("level above the via table: %+v", top)
	}
	if total.Source != "public.votes" || total.Key != "post_id" || total.Sum != "score" || *total.Where["hidden"] != "false" ||
		total.Target != "walcount.via_karma" || total.TargetKey != "parent_key" || total.Column != "total" || !total.CreateMissing {
		t.Errorf("total: %+v", total)
	}
	if target.Source != "public.posts" || target.Key != "id" || target.Sum != "creator_id" || target.Where != nil || target.Column != "target" {
		t.Errorf("target: %+v", target)
	}
	if passes.Source != "public.posts" || *passes.Where["deleted"] != "false" || passes.Filters["state"].Op != counter.OpIn ||
		passes.Filters["creator_id"].Op != counter.OpNotNull || passes.Column != "passes" || passes.Sum != "" {
		t.Errorf("passes: %+v", passes)
	}

	base := "counters:\n  - {name: k, source: votes, key: post_id, target: users, target_key: id, column: karma, "
	for _, tt := range []struct{ name, yaml, err string }{
		{"no table", base + "via: {key: id, column: creator_id}}\n", "counters[0] (k).via.table: required"},
		{"no key", base + "via: {table: posts, column: creator_id}}\n", "counters[0] (k).via.key: required"},
		{"no column", base + "via: {table: posts, key: id}}\n", "counters[0] (k).via.column: required"},
		{"column filtered", base + "via: {table: posts, key: id, column: creator_id, where: {creator_id: 3}}}\n", "via.where.creator_id: via.column is filtered already"},
		{"bad filter", base + "via: {table: posts, key: id, column: creator_id, where: {deleted: {is: 1}}}}\n", "counters[0] (k).via.where.deleted: must be a value"},
		{"max and min", base + "max: score, min: score, via: {table: posts, key: id, column: creator_id}}\n", "counters[0] (k).min: a counter keeps max or min, not both"},
		{"walcount's schema", base + "via: {table: walcount.checkpoint, key: id, column: creator_id}}\n", "the walcount schema is walcount's own"},
		{"long name", strings.Replace(base, "name: k", "name: "+strings.Repeat("k", 52), 1) + "via: {table: posts, key: id, column: creator_id}}\n", "a counter with via has a name of at most 51 bytes"},
		{"unknown key", base + "via: {table: posts, key: id, column: creator_id, filter: {}}}\n", `unknown field "filter" in a counter's via`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tt.yaml), mapEnv(nil), nil)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Load error = %v, want it to contain %q", err, tt.err)
			}
		})
	}
}

// TestLoadViaExtremum: a max or min through a parent expands as a sum
// does, with the extremum kept at both levels: the via table's total is
// the max of the source's column per parent, and the level above is the
// max of total over the via rows that pass, by target (before, it was
// refused: "a max or min cannot go through a parent yet").
func TestLoadViaExtremum(t *testing.T) {
	for _, fn := range []string{"max", "min"} {
		t.Run(fn, func(t *testing.T) {
			yaml := `counters:
  - name: newest
    source: comments
    key: post_id
    ` + fn + `: created_at
    where: {deleted: false}
    via: {table: posts, key: id, column: community_id, where: {deleted: false}}
    target: communities
    target_key: id
    column: last_comment_at
`
			cfg, err := Load(writeFile(t, yaml), mapEnv(nil), nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Counters) != 4 {
				t.Fatalf("counters %+v", cfg.Counters)
			}
			top, total := cfg.Counters[0], cfg.Counters[1]
			ext := func(c counter.Counter) string {
				v, f := c.Extremum()
				return f + "(" + v + ")"
			}
			if top.Source != "walcount.via_newest" || top.Key != "target" || top.Sum != "" || ext(top) != fn+"(total)" || *top.Where["passes"] != "1" {
				t.Errorf("level above the via table: %+v", top)
			}
			if total.Source != "public.comments" || total.Sum != "" || ext(total) != fn+"(created_at)" || total.Column != "total" || *total.Where["deleted"] != "false" {
				t.Errorf("total: %+v", total)
			}
			for _, c := range cfg.Counters[2:] {
				if v, _ := c.Extremum(); v != "" || c.Sum != "community_id" && c.Column == "target" {
					t.Errorf("%s: %+v", c.Name, c)
				}
			}
		})
	}
}
