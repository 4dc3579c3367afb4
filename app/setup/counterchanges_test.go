package setup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// changeModel is one privilege model of docs/operations.md: how the
// operator brings the database in step with an edited configuration.
type changeModel struct {
	name string
	// prepare makes the roles and returns the app's connection (the
	// tables' owner), the superuser's, and walcount's base configuration,
	// and the operator's steps after each edit of the counters.
	prepare func(t *testing.T) (app, super *pgx.Conn, cfg config.Config, apply func(t *testing.T, cfg config.Config))
}

// TestChangingCountersPerPrivilegeModel: the counters are changed in
// production, as docs/configuration.md's "Changing the counters" says,
// under each privilege model: walcount's role owns the tables; the
// owner runs setup --print-sql's statements and walcount's role has only
// what they grant; a managed provider's master user (CREATEROLE, no
// superuser) does the owner's part. Each edit is followed by the
// operator's steps and a restart, and every configured column is then
// exact (a delta lost or counted twice leaves one off):
//
//  1. three counters run under load and walcount is killed (a failpoint
//     before a flush's commit) with deltas still in Redis;
//  2. with those deltas still there: a counter renamed, a filter changed,
//     a sum's column changed, and a counter added on a new table;
//  3. a counter removed (its column no longer changes), a counter removed
//     and its table dropped, a counter's key changed;
//  4. the removed counter added back, as it was: it is backfilled.
func TestChangingCountersPerPrivilegeModel(t *testing.T) {
	t.Parallel()
	for _, m := range []changeModel{
		{"owner", ownerModel},
		{"owner-prepared", preparedModel(false)},
		{"managed", preparedModel(true)},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			testCounterChanges(t, m)
		})
	}
}

const changesSchema = `
ALTER TABLE posts ADD COLUMN comments_count bigint NOT NULL DEFAULT 0, ADD COLUMN score_sum bigint NOT NULL DEFAULT 0,
  ADD COLUMN votes_count bigint NOT NULL DEFAULT 0;
CREATE TABLE comments (id bigserial PRIMARY KEY, post_id bigint NOT NULL, reply_to bigint, score int NOT NULL, weight int NOT NULL, hidden boolean NOT NULL);
INSERT INTO comments (post_id, reply_to, score, weight, hidden)
  SELECT 1 + g % 20, 1 + g % 7, g % 5, g % 3, g % 4 = 0 FROM generate_series(1, 200) g;`

func ownerModel(t *testing.T) (*pgx.Conn, *pgx.Conn, config.Config, func(*testing.T, config.Config)) {
	r := newThreeRoles(t)
	ctx := context.Background()
	// walcount's role is the tables' owner: it may do everything itself.
	if _, err := r.super.Exec(ctx, "ALTER ROLE "+r.owner+" REPLICATION"); err != nil {
		t.Fatal(err)
	}
	cfg := r.config(t)
	cfg.DatabaseURL = r.ownerURL
	apply := func(t *testing.T, cfg config.Config) {
		t.Helper()
		if _, err := setup.Run(ctx, r.ownerConn, setup.Options{Config: cfg, FixReplicaIdentity: true}); err != nil {
			t.Fatalf("setup as the owner: %v", err)
		}
	}
	return r.ownerConn, r.super, cfg, apply
}

// preparedModel: the owner runs --print-sql's output through psql, then
// walcount's role runs setup. managed makes the owner a provider's
// master user: no superuser, CREATEROLE, and the provider's switch.
func preparedModel(managed bool) func(t *testing.T) (*pgx.Conn, *pgx.Conn, config.Config, func(*testing.T, config.Config)) {
	return func(t *testing.T) (*pgx.Conn, *pgx.Conn, config.Config, func(*testing.T, config.Config)) {
		r := newThreeRoles(t)
		ctx := context.Background()
		if managed {
			var db string
			if err := r.super.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			if _, err := r.super.Exec(ctx, "ALTER ROLE "+r.owner+" CREATEROLE; ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET rds.logical_replication = 'on'"); err != nil {
				t.Fatal(err)
			}
		}
		cfg := r.config(t)
		wconn := r.walcountConn(t)
		apply := func(t *testing.T, cfg config.Config) {
			t.Helper()
			checkSaysOwnerSteps(t, cfg)
			var out bytes.Buffer
			if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg, PrintSQL: true, Out: &out, FixReplicaIdentity: true}); err != nil {
				t.Fatalf("setup --print-sql: %v", err)
			}
			r.psql(t, out.String())
			if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg}); err != nil {
				t.Fatalf("setup as walcount's role after the owner's SQL: %v", err)
			}
		}
		return r.ownerConn, r.super, cfg, apply
	}
}

// checkSaysOwnerSteps: walcount check, run as walcount's role with the
// edited configuration (and, as the command does, setup --print-sql's
// statements for a fix that needs the owner), gives every publication
// problem the owner's whole step: all the statements, walcount.messages
// included, with who runs them.
func checkSaysOwnerSteps(t *testing.T, cfg config.Config) {
	t.Helper()
	ctx := context.Background()
	ownerSQL := func(ctx context.Context) (string, error) {
		conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
		if err != nil {
			return "", err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var out bytes.Buffer
		_, err = setup.Run(ctx, conn, setup.Options{Config: cfg, PrintSQL: true, FixReplicaIdentity: true, Out: &out})
		return out.String(), err
	}
	findings, err := preflight.Run(ctx, preflight.Options{Config: cfg, OwnerSQL: ownerSQL})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings {
		if f.Check != preflight.CheckPublication || f.Severity == preflight.OK {
			continue
		}
		if !strings.Contains(f.Fix, "--print-sql") || !strings.Contains(f.Fix, `"walcount"."messages"`) || !strings.Contains(f.Fix, "then walcount setup") {
			t.Errorf("check's publication fix is not the owner's whole step: %s — fix: %s", f.Message, f.Fix)
		}
	}
}

// exactness is, per configured column, the SQL that counts the posts
// whose column is off.
func offPosts(c counter.Counter) string {
	agg := "count(*)"
	if c.Sum != "" {
		agg = "coalesce(sum(s." + c.Sum + "), 0)"
	}
	var conds []string
	for col, v := range c.Where {
		conds = append(conds, fmt.Sprintf(" AND s.%s = %s", col, *v))
	}
	return fmt.Sprintf(`SELECT count(*)::text || coalesce(' (id column truth: ' || string_agg(id || ' ' || col || ' ' || truth, ', ' ORDER BY id) || ')', '')
FROM (SELECT p.id, p.%s AS col, (SELECT %s FROM %s s WHERE s.%s = p.id%s) AS truth FROM posts p) x WHERE col <> truth`,
		c.Column, agg, c.Source, c.Key, strings.Join(conds, ""))
}

func testCounterChanges(t *testing.T, m changeModel) {
	ctx := context.Background()
	app, _, base, apply := m.prepare(t)
	if _, err := app.Exec(ctx, changesSchema); err != nil {
		t.Fatal(err)
	}
	voting := false
	str := func(s string) *string { return &s }
	likes := counter.Default()
	comments := counter.Counter{Name: "post_comments", Source: "public.comments", Key: "post_id", Target: "public.posts", TargetKey: "id",
		Column: "comments_count", Where: map[string]*string{"hidden": str("false")}}
	score := counter.Counter{Name: "post_score", Source: "public.comments", Key: "post_id", Target: "public.posts", TargetKey: "id",
		Column: "score_sum", Sum: "score"}
	base.FlushInterval = 50 * time.Millisecond
	zero := time.Duration(0)
	base.Reconcile.Interval = &zero // only backfills: a scheduled run would hide what they miss
	withCounters := func(cs ...counter.Counter) config.Config {
		cfg := base
		cfg.Counters = cs
		return cfg
	}
	load := func(i int) {
		t.Helper()
		for _, sql := range []string{
			`INSERT INTO likes (post_id) SELECT 1 + (g * 7 + $1) % 20 FROM generate_series(1, 10) g`,
			`DELETE FROM likes WHERE id IN (SELECT id FROM likes ORDER BY random() LIMIT 3)`,
			`INSERT INTO comments (post_id, reply_to, score, weight, hidden) SELECT 1 + (g + $1) % 20, 1 + g % 7, g % 9, g % 4, g % 3 = 0 FROM generate_series(1, 8) g`,
			`UPDATE comments SET hidden = NOT hidden, score = score + 1, weight = weight + 2 WHERE id IN (SELECT id FROM comments ORDER BY random() LIMIT 3)`,
			`DELETE FROM comments WHERE id IN (SELECT id FROM comments ORDER BY random() LIMIT 2)`,
		} {
			args := []any{i}
			if !strings.Contains(sql, "$1") {
				args = nil
			}
			if _, err := app.Exec(ctx, sql, args...); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		if voting {
			if _, err := app.Exec(ctx, `INSERT INTO votes (post_id) SELECT 1 + (g + $1) % 20 FROM generate_series(1, 5) g`, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	exact := func(phase string, cs ...counter.Counter) {
		t.Helper()
		var bad []string
		if wait.Until(time.Minute, 50*time.Millisecond, func() bool {
			bad = bad[:0]
			for _, c := range cs {
				if n := query(t, app, offPosts(c)); n != "0" {
					bad = append(bad, fmt.Sprintf("%s (%s): %s posts off", c.Name, c.Column, n))
				}
			}
			return len(bad) == 0
		}) {
			return
		}
		t.Fatalf("%s: %v", phase, bad)
	}
	run := func(cfg config.Config, fp *failpoint.Set) (stop func(crashed bool)) {
		t.Helper()
		d, err := daemon.New(daemon.Options{Config: cfg, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), RetryMin: 50 * time.Millisecond, RetryMax: time.Second, Failpoints: fp})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		stopped := false
		stop = func(crashed bool) {
			if stopped {
				return
			}
			stopped = true
			if !crashed {
				cancel()
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("walcount run did not return")
			}
			cancel()
			d.Close()
			if crashed && !errors.Is(err, failpoint.ErrCrash) {
				t.Fatalf("walcount run returned %v, want the simulated crash", err)
			}
			if !crashed && err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("walcount run: %v", err)
			}
		}
		t.Cleanup(func() { stop(false) })
		return stop
	}

	// 1. Three counters under load; killed with deltas in Redis.
	cfg := withCounters(likes, comments, score)
	apply(t, cfg)
	stop := run(cfg, nil)
	for i := range 5 {
		load(i)
	}
	exact("first counters", likes, comments, score)
	stop(false)
	fp := &failpoint.Set{}
	fp.Arm(failpoint.BeforeCommit, func() error { return failpoint.ErrCrash })
	stop = run(cfg, fp)
	load(5)
	stop(true)

	// 2. Renamed, filter changed, sum column changed, a counter added on a
	// new table.
	if _, err := app.Exec(ctx, `CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL);
INSERT INTO votes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}
	voting = true
	renamed := likes
	renamed.Name = "likes_per_post"
	comments.Where = map[string]*string{"hidden": str("true")}
	score.Sum = "weight"
	votes := counter.Counter{Name: "post_votes", Source: "public.votes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "votes_count"}
	cfg = withCounters(renamed, comments, score, votes)
	apply(t, cfg)
	stop = run(cfg, nil)
	for i := range 5 {
		load(10 + i)
	}
	exact("after a rename, a new filter, a new sum and a new counter", renamed, comments, score, votes)
	stop(false)

	// 3. A counter removed, one removed with its table, a key changed.
	score.Key = "reply_to"
	cfg = withCounters(renamed, score)
	apply(t, cfg)
	voting = false
	if _, err := app.Exec(ctx, "DROP TABLE votes"); err != nil {
		t.Fatal(err)
	}
	kept := query(t, app, "SELECT string_agg(comments_count::text, ',' ORDER BY id) FROM posts")
	stop = run(cfg, nil)
	for i := range 5 {
		load(20 + i)
	}
	exact("after a removal and a new key", renamed, score)
	stop(false)
	if got := query(t, app, "SELECT string_agg(comments_count::text, ',' ORDER BY id) FROM posts"); got != kept {
		t.Errorf("the column of a removed counter changed: %s, was %s", got, kept)
	}

	// 4. The removed counter back, as it was.
	cfg = withCounters(renamed, comments, score)
	apply(t, cfg)
	stop = run(cfg, nil)
	load(30)
	exact("after a removed counter came back", renamed, comments, score)
	stop(false)
}
