package preflight_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/appschema"
)

// createCounters are two create_missing counters on one target row.
func createCounters(defaults map[string]string) []counter.Counter {
	return []counter.Counter{
		{Name: "post_likes", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "likes_count",
			CreateMissing: true, Defaults: defaults},
		{Name: "post_voters", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "voters", Sum: "user_id",
			CreateMissing: true, Defaults: defaults},
	}
}

// TestCreateMissingCheck: check reports what keeps create_missing
// counters from creating their target rows, once per target table for
// the counters that share the cause, with the fix.
func TestCreateMissingCheck(t *testing.T) {
	t.Parallel()
	// Each case's posts is the subject: it replaces the fixture's.
	likes := appschema.SQL(appschema.Options{LikesColumns: "user_id bigint NOT NULL"}) + "DROP TABLE posts;\n"
	tests := []struct {
		name, schema string
		defaults     map[string]string
		check        string
		sev          preflight.Severity
		msg, fix     string
	}{
		{name: "creatable", defaults: map[string]string{"title": "untitled"},
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0, voters bigint NOT NULL DEFAULT 0, title text NOT NULL);",
			check:  preflight.CheckColumn, sev: preflight.OK,
			msg: "counters post_likes, post_voters: a missing row of public.posts is created (INSERT ... ON CONFLICT (id) DO UPDATE) with id, likes_count, title, voters"},
		{name: "no unique key", defaults: nil,
			schema: "CREATE TABLE posts (id bigint NOT NULL, likes_count bigint NOT NULL DEFAULT 0, voters bigint NOT NULL DEFAULT 0); CREATE INDEX ON posts (id);",
			check:  preflight.CheckColumn, sev: preflight.Problem,
			msg: "counters post_likes, post_voters: create_missing needs a unique index or constraint on public.posts.id alone",
			fix: "ALTER TABLE public.posts ADD UNIQUE (id);"},
		{name: "unique on two columns is not the key's own", defaults: nil,
			schema: "CREATE TABLE posts (id bigint NOT NULL, site int NOT NULL DEFAULT 1, likes_count bigint NOT NULL DEFAULT 0, voters bigint NOT NULL DEFAULT 0, UNIQUE (id, site));",
			check:  preflight.CheckColumn, sev: preflight.Problem,
			msg: "create_missing needs a unique index or constraint on public.posts.id alone"},
		{name: "NOT NULL columns without a default", defaults: map[string]string{"title": "untitled"},
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0, voters bigint NOT NULL DEFAULT 0, title text NOT NULL, author bigint NOT NULL, slug text NOT NULL);",
			check:  preflight.CheckColumn, sev: preflight.Problem,
			msg: "counters post_likes, post_voters: a target row created in public.posts would leave NOT NULL columns author, slug without a value",
			fix: "add create_missing: {defaults: {author: <value>, slug: <value>}} to counters[0], counters[1] in the config file, or give the columns a DEFAULT (ALTER TABLE public.posts ALTER COLUMN author SET DEFAULT <value>;)"},
		{name: "a default for a column that does not exist", defaults: map[string]string{"titel": "untitled"},
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0, voters bigint NOT NULL DEFAULT 0);",
			check:  preflight.CheckColumn, sev: preflight.Problem,
			msg: "counter post_likes: create_missing.defaults names public.posts.titel, which does not exist",
			fix: "fix counters[0].create_missing.defaults in the config file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, likes+tt.schema)
			f.cfg.Counters = createCounters(tt.defaults)
			findings := run(t, f.cfg)
			fd := want(t, findings, tt.check, tt.sev, tt.msg)
			if tt.fix != "" {
				wantFix(t, fd, tt.fix)
			}
			n := 0
			for _, x := range findings {
				if x.Check == tt.check && x.Severity == tt.sev && strings.Contains(x.Message, tt.msg) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d findings %q, want one for the table", n, tt.msg)
			}
		})
	}
}

// TestCreateMissingInsertGrant: a role that may update the counter
// columns but not insert rows is told the least GRANT that lets it.
func TestCreateMissingInsertGrant(t *testing.T) {
	t.Parallel()
	f := newFixture(t, appschema.SQL(appschema.Options{
		PostsColumns: "voters bigint NOT NULL DEFAULT 0, title text NOT NULL", LikesColumns: "user_id bigint NOT NULL"}))
	f.setUp(t)
	role := fmt.Sprintf("preflight_create_%d_%d", os.Getpid(), slotSeq.Add(1))
	f.exec(t, "CREATE ROLE "+role+" LOGIN REPLICATION")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = f.conn.Exec(ctx, "DROP ROLE "+role)
	})
	f.exec(t, "GRANT SELECT ON likes TO "+role+"; GRANT SELECT (id, likes_count, voters), UPDATE (likes_count, voters) ON posts TO "+role)
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg := f.cfg
	cfg.DatabaseURL = u.String()
	cfg.Counters = createCounters(map[string]string{"title": "untitled"})
	p := want(t, run(t, cfg), preflight.CheckPrivilege, preflight.Problem,
		"counters post_likes, post_voters: role "+role+" lacks INSERT on public.posts (id, likes_count, title, voters), which creating missing rows needs")
	wantFix(t, p, "GRANT INSERT (id, likes_count, title, voters) ON public.posts TO "+role+";")

	f.exec(t, "GRANT INSERT (id, likes_count, title, voters) ON posts TO "+role)
	want(t, run(t, cfg), preflight.CheckColumn, preflight.OK, "a missing row of public.posts is created")
}
