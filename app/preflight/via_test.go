package preflight_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/counter"
)

// viaCounters is the karma of a user through the creator of a post.
func viaCounters(t *testing.T) []counter.Counter {
	t.Helper()
	cs := counter.ExpandThrough([]counter.Counter{{Name: "karma", Source: "votes", Key: "post_id", Target: "users", TargetKey: "id", Column: "karma", Sum: "score",
		Through: &counter.Through{Table: "posts", Key: "id", Column: "creator_id", Where: map[string]*string{"deleted": new("false")}}}})
	if ps := counter.Validate(cs); len(ps) > 0 {
		t.Fatalf("validate: %v", ps)
	}
	return cs
}

// TestViaCheck: before walcount setup, check reports the missing via
// table once, as setup's to make, and the parent's replica identity once
// for the parent (not once per counter of the via table); a parent
// column naming the target that is not an integer is refused by check
// and by the statements run builds alike.
func TestViaCheck(t *testing.T) {
	t.Parallel()
	const schema = `CREATE TABLE users (id bigint PRIMARY KEY, karma bigint NOT NULL DEFAULT 0);
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, score smallint NOT NULL);
ALTER TABLE votes REPLICA IDENTITY FULL;
CREATE INDEX ON votes (post_id);`
	t.Run("before setup", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, schema+"CREATE TABLE posts (id bigint PRIMARY KEY, creator_id bigint, deleted boolean NOT NULL DEFAULT false);")
		f.cfg.Counters = viaCounters(t)
		findings := run(t, f.cfg)
		p := want(t, findings, preflight.CheckTable, preflight.Problem, "counter karma: its via table walcount.via_karma does not exist")
		if p.Cause != preflight.CauseSetup || p.Fix != "walcount setup" {
			t.Errorf("missing via table: %+v, want setup's to fix", p)
		}
		var identity []string
		for _, f := range findings {
			if f.Check == preflight.CheckReplicaIdentity && f.Severity == preflight.Problem {
				identity = append(identity, f.Message)
			}
		}
		if len(identity) != 1 || !strings.Contains(identity[0], "counter karma (through public.posts): replica identity of public.posts is DEFAULT") ||
			!strings.Contains(identity[0], "creator_id, deleted") {
			t.Errorf("identity findings %q, want one for public.posts naming creator_id and deleted", identity)
		}
	})
	t.Run("a uuid names the target", func(t *testing.T) {
		t.Parallel()
		cs := viaCounters(t)
		var ddl []string
		for _, c := range cs {
			if c.Through.Role == "" {
				ddl = counter.ViaTableSQL(c.Name, counter.Column{Full: "bigint"}, counter.Column{Full: "bigint"}, false)
			}
		}
		f := newFixture(t, schema+"CREATE TABLE posts (id bigint PRIMARY KEY, creator_id uuid, deleted boolean NOT NULL DEFAULT false); ALTER TABLE posts REPLICA IDENTITY FULL; CREATE SCHEMA walcount; "+
			strings.Join(ddl, "; ")+";")
		f.cfg.Counters = cs
		want(t, run(t, f.cfg), preflight.CheckColumn, preflight.Problem,
			"counter karma (through public.posts): via column public.posts.creator_id is uuid: the column naming the target through a parent must be smallint, integer or bigint")
		conn, err := pgx.Connect(context.Background(), f.cfg.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		_, err = counter.Resolve(context.Background(), conn, cs[2])
		if !errors.Is(err, counter.ErrBadTarget) || !strings.Contains(err.Error(), "must be smallint, integer or bigint") {
			t.Errorf("Resolve of %s: %v, want the same refusal", cs[2].Name, err)
		}
	})
	t.Run("a max in a sum's via table", func(t *testing.T) {
		// The counter was a sum of the same name: its via table's total
		// is NOT NULL DEFAULT 0, where a max keeps NULL for a post with
		// no vote (its flush would fail on it, its seed start at 0).
		t.Parallel()
		cs := viaCounters(t)
		var ddl []string
		for i := range cs {
			if cs[i].Through.Role == "" {
				ddl = counter.ViaTableSQL(cs[i].Name, counter.Column{Full: "bigint"}, counter.Column{Full: "bigint"}, false)
			}
			if cs[i].Sum == "score" || cs[i].Sum == counter.ViaTotal {
				cs[i].Max, cs[i].Sum = cs[i].Sum, ""
			}
		}
		f := newFixture(t, schema+"CREATE TABLE posts (id bigint PRIMARY KEY, creator_id bigint, deleted boolean NOT NULL DEFAULT false); ALTER TABLE posts REPLICA IDENTITY FULL; CREATE SCHEMA walcount; "+
			strings.Join(ddl, "; ")+";")
		f.cfg.Counters = cs
		p := want(t, run(t, f.cfg), preflight.CheckColumn, preflight.Problem,
			"counter karma: its via table walcount.via_karma has a total NOT NULL, made for a count or a sum: a max through a parent keeps NULL for a parent with no value")
		if p.Fix != "DROP TABLE walcount.via_karma; then walcount setup" {
			t.Errorf("fix %q", p.Fix)
		}
	})
	t.Run("a sum in a max's via table", func(t *testing.T) {
		// The other way round: a max's via table has a nullable total,
		// which a sum's flush would keep NULL (NULL + delta).
		t.Parallel()
		cs := viaCounters(t)
		var ddl []string
		for _, c := range cs {
			if c.Through.Role == "" {
				ddl = counter.ViaTableSQL(c.Name, counter.Column{Full: "bigint"}, counter.Column{Full: "bigint"}, true)
			}
		}
		f := newFixture(t, schema+"CREATE TABLE posts (id bigint PRIMARY KEY, creator_id bigint, deleted boolean NOT NULL DEFAULT false); ALTER TABLE posts REPLICA IDENTITY FULL; CREATE SCHEMA walcount; "+
			strings.Join(ddl, "; ")+";")
		f.cfg.Counters = cs
		p := want(t, run(t, f.cfg), preflight.CheckColumn, preflight.Problem,
			"counter karma: its via table walcount.via_karma has a total of bigint that may be NULL, made for a max or min")
		if p.Fix != "DROP TABLE walcount.via_karma; then walcount setup" {
			t.Errorf("fix %q", p.Fix)
		}
	})
}
