package preflight_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/state"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// goodSchema is the default counter's tables as walcount wants them: the
// key in the replica identity, both keys indexed, a NOT NULL counter column.
var goodSchema = appschema.SQL(appschema.Options{LikesColumns: "user_id bigint NOT NULL, UNIQUE (post_id, user_id)"})

// fixture is a fresh database on the shared cluster and a Config for it.
type fixture struct {
	url  string
	conn *pgx.Conn
	cfg  config.Config
}

var slotSeq atomic.Int64

// newFixture creates a database and runs schema in it. Slots are
// cluster-wide and the cluster is shared, so each fixture has its own slot
// name.
func newFixture(t *testing.T, schema string) *fixture {
	t.Helper()
	return fixtureOn(t, testenv.Database(t), schema)
}

func fixtureOn(t *testing.T, dbURL, schema string) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to the test database: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	f := &fixture{url: dbURL, conn: conn, cfg: config.Default()}
	f.cfg.DatabaseURL = dbURL
	f.cfg.RedisURL = testenv.RedisURL(t)
	f.cfg.Slot = fmt.Sprintf("preflight_%d_%d", os.Getpid(), slotSeq.Add(1))
	if schema != "" {
		f.exec(t, schema)
	}
	return f
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// createSlot creates a logical slot and drops it when the test ends: a
// database with a slot cannot be dropped.
func (f *fixture) createSlot(t *testing.T, plugin string) {
	t.Helper()
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, $2)", f.cfg.Slot, plugin)
	t.Cleanup(func() {
		_, _ = f.conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", f.cfg.Slot)
	})
}

// createCheckpoint creates walcount's state table with a row at lsn
// ("" means the slot's confirmed position).
func (f *fixture) createCheckpoint(t *testing.T, lsn string) {
	t.Helper()
	if _, _, err := state.Migrate(context.Background(), f.conn); err != nil {
		t.Fatal(err)
	}
	if lsn == "" {
		f.exec(t, `INSERT INTO walcount.checkpoint
SELECT slot_name, confirmed_flush_lsn, now() FROM pg_replication_slots WHERE slot_name = $1`, f.cfg.Slot)
	} else {
		f.exec(t, "INSERT INTO walcount.checkpoint VALUES ($1, $2::pg_lsn, now())", f.cfg.Slot, lsn)
	}
}

// setUp does what `walcount setup` does: the state schema, the
// publication, then the slot, its checkpoint and the publication mark
// (a position past the publication, taken before the slot).
func (f *fixture) setUp(t *testing.T) {
	t.Helper()
	f.setUpWith(t, "CREATE PUBLICATION walcount FOR TABLE likes, posts, walcount.messages")
}

// setUpWith is setUp with the publication pubDDL creates.
func (f *fixture) setUpWith(t *testing.T, pubDDL string) {
	t.Helper()
	if _, _, err := state.Migrate(context.Background(), f.conn); err != nil {
		t.Fatal(err)
	}
	f.exec(t, pubDDL)
	var mark string
	if err := f.conn.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&mark); err != nil {
		t.Fatal(err)
	}
	f.createSlot(t, "pgoutput")
	f.createCheckpoint(t, "")
	f.exec(t, `UPDATE walcount.checkpoint SET publication_oid = (SELECT oid FROM pg_publication WHERE pubname = 'walcount'),
publication_lsn = $2::pg_lsn WHERE slot_name = $1`, f.cfg.Slot, mark)
	if err := state.Claim(context.Background(), f.conn, f.cfg.Slot, f.cfg.Counters); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, cfg config.Config) []preflight.Finding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	findings, err := preflight.Run(ctx, preflight.Options{Config: cfg})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var b strings.Builder
	preflight.Format(&b, findings)
	t.Logf("findings:\n%s", b.String())
	return findings
}

// want finds the finding of check with severity sev whose message contains
// msg, and fails the test when there is none.
func want(t *testing.T, findings []preflight.Finding, check string, sev preflight.Severity, msg string) preflight.Finding {
	t.Helper()
	for _, f := range findings {
		if f.Check == check && f.Severity == sev && strings.Contains(f.Message, msg) {
			return f
		}
	}
	t.Fatalf("no %s finding of check %s containing %q", sev, check, msg)
	return preflight.Finding{}
}

func wantFix(t *testing.T, f preflight.Finding, fix string) {
	t.Helper()
	if f.Fix != fix {
		t.Errorf("fix of %q = %q, want %q", f.Message, f.Fix, fix)
	}
}

// none fails the test when a finding of check has severity sev.
func none(t *testing.T, findings []preflight.Finding, check string, sev preflight.Severity) {
	t.Helper()
	for _, f := range findings {
		if f.Check == check && f.Severity == sev {
			t.Errorf("unexpected %s: %s", sev, f.Message)
		}
	}
}

func TestAllGreen(t *testing.T) {
	t.Parallel()
	f := newFixture(t, goodSchema)
	f.setUp(t)
	findings := run(t, f.cfg)

	for _, fd := range findings {
		switch {
		case fd.Severity == preflight.Problem:
			t.Errorf("problem on a set-up database: %s — fix: %s", fd.Message, fd.Fix)
		case fd.Severity == preflight.Warning && fd.Check != preflight.CheckSlotWALKeepSize:
			t.Errorf("warning on a set-up database: %s", fd.Message)
		}
	}
	if preflight.HasProblems(findings) {
		t.Error("HasProblems = true")
	}
	for _, c := range []string{
		preflight.CheckServerVersion, preflight.CheckWALLevel, preflight.CheckReplicationSlots, preflight.CheckWALSenders,
		preflight.CheckRole, preflight.CheckReplicationConn, preflight.CheckEmitMessage, preflight.CheckColumn,
		preflight.CheckPrivilege, preflight.CheckReplicaIdentity, preflight.CheckPublication, preflight.CheckSlot,
		preflight.CheckCheckpoint, preflight.CheckRedis, preflight.CheckRedisWritable,
	} {
		want(t, findings, c, preflight.OK, "")
	}
	// PostgreSQL's default keeps WAL without limit: a warning with advice.
	w := want(t, findings, preflight.CheckSlotWALKeepSize, preflight.Warning, "walcount_slot_retained_wal_bytes")
	wantFix(t, w, "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();")

	var b strings.Builder
	preflight.Format(&b, findings)
	if !strings.Contains(b.String(), "ok      wal_level is logical\n") {
		t.Errorf("Format output lacks the wal_level line:\n%s", b.String())
	}
}

// TestServerSettings runs against a private cluster that cannot do logical
// replication at all.
func TestServerSettings(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t, servers.PostgresOptions{Settings: map[string]string{
		"wal_level":              "replica",
		"max_replication_slots":  "1",
		"max_wal_senders":        "0",
		"max_slot_wal_keep_size": "1GB",
	}})
	f := fixtureOn(t, pg.URL(), goodSchema)
	// A physical slot can exist under wal_level=replica; it takes the only one.
	f.exec(t, "SELECT pg_create_physical_replication_slot('other')")
	findings := run(t, f.cfg)

	t.Run("wal_level", func(t *testing.T) {
		p := want(t, findings, preflight.CheckWALLevel, preflight.Problem, "wal_level is replica")
		wantFix(t, p, "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL")
	})
	t.Run("no free slot", func(t *testing.T) {
		p := want(t, findings, preflight.CheckReplicationSlots, preflight.Problem, "max_replication_slots is 1 and 1 are in use")
		if !strings.HasPrefix(p.Fix, "ALTER SYSTEM SET max_replication_slots = 2;") {
			t.Errorf("fix = %q", p.Fix)
		}
	})
	t.Run("no free WAL sender", func(t *testing.T) {
		p := want(t, findings, preflight.CheckWALSenders, preflight.Problem, "max_wal_senders is 0")
		wantFix(t, p, "ALTER SYSTEM SET max_wal_senders = 1; then restart PostgreSQL")
		want(t, findings, preflight.CheckReplicationConn, preflight.Problem, "cannot open a replication connection")
	})
	t.Run("max_slot_wal_keep_size set", func(t *testing.T) {
		want(t, findings, preflight.CheckSlotWALKeepSize, preflight.OK, "max_slot_wal_keep_size is 1GB")
	})
}

func TestReplicaIdentity(t *testing.T) {
	t.Parallel()
	const posts = "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);\n"
	tests := []struct {
		name   string
		schema string
		where  map[string]*string
		sum    string
		// problem is "" when the identity is fine, else a part of the
		// message; fix is then the expected fix.
		problem, fix string
	}{
		{name: "default identity with a surrogate key",
			schema:  "CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL);",
			problem: "replica identity of public.likes is DEFAULT, the primary key (id), which does not contain post_id",
			fix:     "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "default identity without a primary key",
			schema:  "CREATE TABLE likes (post_id bigint NOT NULL, user_id bigint NOT NULL);",
			problem: "DEFAULT without a primary key", fix: "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "identity nothing",
			schema:  "CREATE TABLE likes (post_id bigint PRIMARY KEY); ALTER TABLE likes REPLICA IDENTITY NOTHING;",
			problem: "is NOTHING", fix: "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "primary key containing the key",
			schema: "CREATE TABLE likes (post_id bigint, user_id bigint, PRIMARY KEY (user_id, post_id));"},
		{name: "identity full",
			schema: "CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL); ALTER TABLE likes REPLICA IDENTITY FULL;"},
		{name: "identity using an index containing the key",
			schema: `CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL);
CREATE UNIQUE INDEX likes_post_user ON likes (post_id, user_id);
ALTER TABLE likes REPLICA IDENTITY USING INDEX likes_post_user;`},
		{name: "identity using an index without the key",
			schema: `CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL);
CREATE UNIQUE INDEX likes_user ON likes (user_id, id);
ALTER TABLE likes REPLICA IDENTITY USING INDEX likes_user;`,
			problem: "USING INDEX likes_user (user_id, id), which does not contain post_id",
			fix:     "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "where column outside the identity",
			schema:  "CREATE TABLE likes (post_id bigint, user_id bigint, deleted_at timestamptz, PRIMARY KEY (post_id, user_id));",
			where:   map[string]*string{"deleted_at": nil},
			problem: "which does not contain deleted_at", fix: "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "summed column outside the identity",
			schema:  "CREATE TABLE likes (post_id bigint, user_id bigint, weight int NOT NULL, PRIMARY KEY (post_id, user_id));",
			sum:     "weight",
			problem: "which does not contain weight", fix: "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "partition without the key in its identity",
			schema: `CREATE TABLE likes (id bigint NOT NULL, post_id bigint NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE likes_a PARTITION OF likes FOR VALUES FROM (0) TO (100);
CREATE TABLE likes_b PARTITION OF likes FOR VALUES FROM (100) TO (200);
ALTER TABLE likes_a REPLICA IDENTITY FULL;
ALTER TABLE likes_b ADD PRIMARY KEY (id);`,
			problem: "replica identity of public.likes_b is DEFAULT, the primary key (id)",
			fix:     "ALTER TABLE public.likes_b REPLICA IDENTITY FULL;"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, posts+tt.schema)
			f.cfg.Counters[0].Where = tt.where
			f.cfg.Counters[0].Sum = tt.sum
			findings := run(t, f.cfg)
			if tt.problem == "" {
				none(t, findings, preflight.CheckReplicaIdentity, preflight.Problem)
				want(t, findings, preflight.CheckReplicaIdentity, preflight.OK, "replica identity of public.likes")
				return
			}
			p := want(t, findings, preflight.CheckReplicaIdentity, preflight.Problem, tt.problem)
			wantFix(t, p, tt.fix)
			if !strings.Contains(p.Message, "REPLICA IDENTITY USING INDEX") {
				t.Errorf("message does not mention the unique-index alternative: %s", p.Message)
			}
		})
	}
}

func TestRole(t *testing.T) {
	t.Parallel()
	f := newFixture(t, goodSchema)
	f.setUp(t)
	role := fmt.Sprintf("preflight_app_%d_%d", os.Getpid(), slotSeq.Add(1))
	f.exec(t, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = f.conn.Exec(ctx, "DROP ROLE "+role)
	})
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	u.User = url.User(role)
	cfg := f.cfg
	cfg.DatabaseURL = u.String()

	t.Run("without REPLICATION or grants", func(t *testing.T) {
		findings := run(t, cfg)
		p := want(t, findings, preflight.CheckRole, preflight.Problem, "role "+role+" has neither REPLICATION nor SUPERUSER")
		wantFix(t, p, "ALTER ROLE "+role+" REPLICATION;")
		p = want(t, findings, preflight.CheckPrivilege, preflight.Problem, "lacks SELECT on public.likes")
		wantFix(t, p, "GRANT SELECT ON public.likes TO "+role+"; GRANT SELECT (id, likes_count), UPDATE (likes_count) ON public.posts TO "+role+";")
		p = want(t, findings, preflight.CheckCheckpoint, preflight.Problem, "may not use walcount's state: it lacks USAGE on schema walcount")
		wantFix(t, p, "GRANT USAGE ON SCHEMA walcount TO "+role+"; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO "+role+"; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO "+role+"; "+
			"ALTER DEFAULT PRIVILEGES IN SCHEMA walcount GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+role+"; ALTER DEFAULT PRIVILEGES IN SCHEMA walcount GRANT USAGE, SELECT ON SEQUENCES TO "+role+";")
	})

	t.Run("with REPLICATION and grants", func(t *testing.T) {
		f.exec(t, "ALTER ROLE "+role+" REPLICATION")
		f.exec(t, "GRANT SELECT ON likes TO "+role)
		f.exec(t, "GRANT SELECT (id, likes_count), UPDATE (likes_count) ON posts TO "+role)
		f.exec(t, "GRANT USAGE ON SCHEMA walcount TO "+role)
		f.exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO "+role)
		f.exec(t, "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO "+role)
		findings := run(t, cfg)
		if preflight.HasProblems(findings) {
			t.Error("problems remain after the fixes")
		}
		want(t, findings, preflight.CheckRole, preflight.OK, "role "+role+" has REPLICATION")
		want(t, findings, preflight.CheckReplicationConn, preflight.OK, "replication connection works")
	})

	t.Run("no CREATE on the database before setup", func(t *testing.T) {
		f.exec(t, "DROP SCHEMA walcount CASCADE")
		findings := run(t, cfg)
		p := want(t, findings, preflight.CheckCreateSchema, preflight.Problem, "schema walcount does not exist")
		db := strings.TrimPrefix(u.Path, "/")
		wantFix(t, p, fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s;", db, role))
	})
}

func TestPublication(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, ddl    string // ddl "" means no publication
		problem, fix string
		// columnLists marks cases whose DDL needs PostgreSQL 15: before
		// it, the DDL itself must be refused.
		columnLists bool
	}{
		{name: "missing", problem: "publication walcount does not exist",
			fix: "CREATE PUBLICATION walcount FOR TABLE public.likes, public.posts (id, likes_count), walcount.messages;"},
		{name: "without the source table", ddl: "CREATE PUBLICATION walcount FOR TABLE posts",
			problem: "publication walcount does not include public.likes",
			fix:     "ALTER PUBLICATION walcount ADD TABLE public.likes;"},
		{name: "without the target table", ddl: "CREATE PUBLICATION walcount FOR TABLE likes",
			problem: "publication walcount does not include the target public.posts",
			fix:     "ALTER PUBLICATION walcount ADD TABLE public.posts (id, likes_count);"},
		{name: "without delete and truncate", ddl: "CREATE PUBLICATION walcount FOR TABLE likes, posts WITH (publish = 'insert, update')",
			problem: "does not publish delete, truncate",
			fix:     "ALTER PUBLICATION walcount SET (publish = 'insert, update, delete, truncate');"},
		{name: "row filter", ddl: "CREATE PUBLICATION walcount FOR TABLE likes WHERE (user_id > 0), posts", columnLists: true,
			problem: "filters the rows of public.likes",
			fix:     "ALTER PUBLICATION walcount DROP TABLE public.likes; ALTER PUBLICATION walcount ADD TABLE public.likes;"},
		{name: "column list without the key", ddl: "CREATE PUBLICATION walcount FOR TABLE likes (id, user_id), posts", columnLists: true,
			problem: "leaves out column post_id of public.likes",
			fix:     "ALTER PUBLICATION walcount DROP TABLE public.likes; ALTER PUBLICATION walcount ADD TABLE public.likes;"},
		{name: "for all tables", ddl: "CREATE PUBLICATION walcount FOR ALL TABLES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, goodSchema)
			v, err := pgversion.Read(context.Background(), f.conn)
			if err != nil {
				t.Fatal(err)
			}
			if tt.columnLists && !v.PublicationColumnLists() {
				if _, err := f.conn.Exec(context.Background(), tt.ddl); err == nil {
					t.Fatalf("PostgreSQL %s accepted %q, which needs column lists and row filters (15)", v, tt.ddl)
				}
				return
			}
			if !v.PublicationColumnLists() {
				// Before 15 a target is published whole.
				tt.fix = strings.ReplaceAll(tt.fix, " (id, likes_count)", "")
			}
			if tt.ddl != "" {
				f.exec(t, tt.ddl)
			}
			findings := run(t, f.cfg)
			if tt.problem == "" {
				none(t, findings, preflight.CheckPublication, preflight.Problem)
				want(t, findings, preflight.CheckPublication, preflight.OK, "publishes insert, update, delete and truncate of public.likes")
				return
			}
			wantFix(t, want(t, findings, preflight.CheckPublication, preflight.Problem, tt.problem), tt.fix)
		})
	}
}

func TestSlot(t *testing.T) {
	t.Parallel()
	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		findings := run(t, f.cfg)
		p := want(t, findings, preflight.CheckSlot, preflight.Problem, "replication slot "+f.cfg.Slot+" does not exist")
		wantFix(t, p, "walcount setup")
		want(t, findings, preflight.CheckReplicationSlots, preflight.OK, "free")
	})
	t.Run("missing after setup, on_slot_loss recreate", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		f.setUp(t)
		f.exec(t, "SELECT pg_drop_replication_slot($1)", f.cfg.Slot)
		// stop: a problem, as before.
		p := want(t, run(t, f.cfg), preflight.CheckSlot, preflight.Problem, "does not exist")
		wantFix(t, p, "walcount setup")
		// recreate: run repairs it by itself, so it must start.
		f.cfg.OnSlotLoss = config.SlotLossRecreate
		findings := run(t, f.cfg)
		want(t, findings, preflight.CheckSlot, preflight.Warning, "on_slot_loss is recreate: walcount run creates it anew")
		if preflight.HasProblems(findings) {
			t.Errorf("a missing slot with on_slot_loss recreate is still a problem: %+v", findings)
		}
	})
	t.Run("missing before setup, on_slot_loss recreate", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		f.cfg.OnSlotLoss = config.SlotLossRecreate
		p := want(t, run(t, f.cfg), preflight.CheckSlot, preflight.Problem, "does not exist")
		wantFix(t, p, "walcount setup")
	})
	t.Run("wrong plugin", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		f.createSlot(t, "test_decoding")
		findings := run(t, f.cfg)
		p := want(t, findings, preflight.CheckSlot, preflight.Problem, "uses plugin test_decoding, not pgoutput")
		wantFix(t, p, "walcount setup --recreate-slot (walcount run then repairs every counter by itself)")
	})
	t.Run("other database", func(t *testing.T) {
		t.Parallel()
		other := newFixture(t, "")
		other.createSlot(t, "pgoutput")
		f := newFixture(t, goodSchema)
		f.cfg.Slot = other.cfg.Slot
		findings := run(t, f.cfg)
		want(t, findings, preflight.CheckSlot, preflight.Problem, "belongs to database")
	})
}

func TestCheckpoint(t *testing.T) {
	t.Parallel()
	t.Run("schema missing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		findings := run(t, f.cfg)
		wantFix(t, want(t, findings, preflight.CheckCheckpoint, preflight.Problem, "table walcount.checkpoint does not exist"), "walcount setup")
		want(t, findings, preflight.CheckCreateSchema, preflight.OK, "may create schema walcount")
	})
	t.Run("row missing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		f.createSlot(t, "pgoutput")
		f.createCheckpoint(t, "0/0")
		f.exec(t, "DELETE FROM walcount.checkpoint")
		findings := run(t, f.cfg)
		wantFix(t, want(t, findings, preflight.CheckCheckpoint, preflight.Problem, "has no row for slot "+f.cfg.Slot), "walcount setup")
	})
	t.Run("behind the slot", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, goodSchema)
		f.createSlot(t, "pgoutput")
		f.createCheckpoint(t, "0/1")
		findings := run(t, f.cfg)
		wantFix(t, want(t, findings, preflight.CheckCheckpoint, preflight.Warning, "is behind the slot's confirmed position"), "nothing: walcount run tells the two cases apart at start, and in the first marks every counter dirty and repairs it")
	})
}

func TestTablesAndColumns(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	tests := []struct {
		name    string
		schema  string
		counter func(c *counter.Counter)
		check   string
		sev     preflight.Severity
		msg     string
		fix     string
	}{
		{name: "source table missing", schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL);",
			check: preflight.CheckTable, sev: preflight.Problem, msg: "source table public.likes does not exist in database test_"},
		{name: "target table missing", schema: "CREATE TABLE likes (post_id bigint PRIMARY KEY);",
			check: preflight.CheckTable, sev: preflight.Problem, msg: "target table public.posts does not exist in database test_"},
		{name: "source is a view", schema: goodSchema + "CREATE VIEW likes_v AS SELECT * FROM likes;",
			counter: func(c *counter.Counter) { c.Source = "public.likes_v" },
			check:   preflight.CheckTable, sev: preflight.Problem, msg: "source public.likes_v is not a table (relkind v)"},
		{name: "key column missing", schema: goodSchema,
			counter: func(c *counter.Counter) { c.Key = "postid" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "column public.likes.postid does not exist",
			fix: "set counters[0].key in the config file to a column of public.likes"},
		{name: "counter column missing",
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY); CREATE TABLE likes (post_id bigint PRIMARY KEY);",
			check:  preflight.CheckColumn, sev: preflight.Problem, msg: "counter column public.posts.likes_count does not exist",
			fix: "ALTER TABLE public.posts ADD COLUMN likes_count bigint NOT NULL DEFAULT 0; then walcount reconcile"},
		{name: "counter column is text",
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count text); CREATE TABLE likes (post_id bigint PRIMARY KEY);",
			check:  preflight.CheckColumn, sev: preflight.Problem, msg: "counter column public.posts.likes_count is text",
			fix: "ALTER TABLE public.posts ALTER COLUMN likes_count TYPE bigint;"},
		{name: "counter column allows NULL",
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count int); CREATE TABLE likes (post_id bigint PRIMARY KEY);",
			check:  preflight.CheckColumn, sev: preflight.Warning, msg: "allows NULL",
			fix: "UPDATE public.posts SET likes_count = 0 WHERE likes_count IS NULL; ALTER TABLE public.posts ALTER COLUMN likes_count SET DEFAULT 0, ALTER COLUMN likes_count SET NOT NULL;"},
		{name: "key types differ",
			schema: "CREATE TABLE posts (id uuid PRIMARY KEY, likes_count bigint NOT NULL); CREATE TABLE likes (post_id bigint PRIMARY KEY);",
			check:  preflight.CheckColumn, sev: preflight.Problem, msg: "key public.likes.post_id is bigint but target key public.posts.id is uuid"},
		{name: "key type unusable",
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL); CREATE TABLE likes (post_id numeric PRIMARY KEY);",
			check:  preflight.CheckColumn, sev: preflight.Problem, msg: "key column public.likes.post_id is numeric"},
		{name: "integer families match",
			schema: "CREATE TABLE posts (id smallint PRIMARY KEY, likes_count int NOT NULL); CREATE TABLE likes (post_id bigint PRIMARY KEY);",
			check:  preflight.CheckColumn, sev: preflight.OK, msg: "public.likes.post_id (bigint) counts into public.posts.likes_count (integer), matched on id (smallint)"},
		{name: "text keys",
			schema:  "CREATE TABLE posts (slug text PRIMARY KEY, likes_count int NOT NULL); CREATE TABLE likes (post_slug varchar(40) PRIMARY KEY);",
			counter: func(c *counter.Counter) { c.Key, c.TargetKey = "post_slug", "slug" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: "public.likes.post_slug (character varying(40))"},
		{name: "summed column is text", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight text;",
			counter: func(c *counter.Counter) { c.Sum = "weight" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "summed column public.likes.weight is text"},
		{name: "numeric sum into bigint", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight numeric;",
			counter: func(c *counter.Counter) { c.Sum = "weight" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "summed column public.likes.weight is numeric but counter column public.posts.likes_count is bigint",
			fix: "ALTER TABLE public.posts ALTER COLUMN likes_count TYPE numeric;"},
		{name: "unconstrained numeric sum", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight numeric; ALTER TABLE posts ADD COLUMN weight numeric NOT NULL DEFAULT 0;",
			counter: func(c *counter.Counter) { c.Sum, c.Column = "weight", "weight" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "summed column public.likes.weight is numeric: it has no declared scale",
			fix: "ALTER TABLE public.likes ALTER COLUMN weight TYPE numeric(12,2);"},
		{name: "numeric sum with scale above 9", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight numeric(20,10); ALTER TABLE posts ADD COLUMN weight numeric NOT NULL DEFAULT 0;",
			counter: func(c *counter.Counter) { c.Sum, c.Column = "weight", "weight" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "summed column public.likes.weight is numeric(20,10): its scale is above 9",
			fix: "ALTER TABLE public.likes ALTER COLUMN weight TYPE numeric(12,2);"},
		{name: "numeric domain sum", schema: goodSchema + "CREATE DOMAIN money2 AS numeric(12,2); ALTER TABLE likes ADD COLUMN weight money2; ALTER TABLE posts ADD COLUMN weight numeric NOT NULL DEFAULT 0;",
			counter: func(c *counter.Counter) { c.Sum, c.Column = "weight", "weight" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "summed column public.likes.weight is money2, a domain over numeric",
			fix: "ALTER TABLE public.likes ALTER COLUMN weight TYPE numeric(12,2);"},
		{name: "numeric sum into a column of smaller scale", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight numeric(12,2); ALTER TABLE posts ADD COLUMN weight numeric(14,1) NOT NULL DEFAULT 0;",
			counter: func(c *counter.Counter) { c.Sum, c.Column = "weight", "weight" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "counter column public.posts.weight is numeric(14,1), which cannot hold its fractional digits",
			fix: "ALTER TABLE public.posts ALTER COLUMN weight TYPE numeric;"},
		{name: "numeric(12,2) sum", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight numeric(12,2); ALTER TABLE posts ADD COLUMN weight numeric(14,2) NOT NULL DEFAULT 0;",
			counter: func(c *counter.Counter) { c.Sum, c.Column = "weight", "weight" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: "counts into public.posts.weight (numeric(14,2))"},
		{name: "numeric sum of scale 0 into bigint", schema: goodSchema + "ALTER TABLE likes ADD COLUMN weight numeric(10,0);",
			counter: func(c *counter.Counter) { c.Sum = "weight" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: "counts into public.posts.likes_count (bigint)"},
		{name: "where column missing", schema: goodSchema,
			counter: func(c *counter.Counter) { c.Where = map[string]*string{"deleted_at": nil} },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "column public.likes.deleted_at does not exist"},
		{name: "where value invalid", schema: goodSchema + "ALTER TABLE likes ADD COLUMN spam boolean;",
			counter: func(c *counter.Counter) { c.Where = map[string]*string{"spam": str("maybe")} },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: `where value "maybe" is not a valid boolean for public.likes.spam`,
			fix: "fix counters[0].where.spam in the config file"},
		{name: "where value invalid in a list", schema: goodSchema + "ALTER TABLE likes ADD COLUMN spam boolean;",
			counter: func(c *counter.Counter) {
				c.Filters = map[string]counter.Filter{"spam": {Op: counter.OpNotIn, Values: []string{"true", "perhaps"}}}
			},
			check: preflight.CheckColumn, sev: preflight.Problem, msg: `where value "perhaps" is not a valid boolean for public.likes.spam`,
			fix: "fix counters[0].where.spam in the config file"},
		{name: "filters beyond equality", schema: goodSchema + "ALTER TABLE likes ADD COLUMN kind text, ADD COLUMN status int;",
			counter: func(c *counter.Counter) {
				c.Filters = map[string]counter.Filter{"kind": {Op: counter.OpIn, Values: []string{"a", "b"}}, "status": {Op: counter.OpNe, Values: []string{"3"}},
					"user_id": {Op: counter.OpNotNull}}
			},
			check: preflight.CheckColumn, sev: preflight.OK, msg: "counts into public.posts.likes_count (bigint)"},
		{name: "boolean sum", schema: goodSchema + "ALTER TABLE likes ADD COLUMN up boolean;",
			counter: func(c *counter.Counter) { c.Sum = "up" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: "counts into public.posts.likes_count (bigint)"},
		{name: "boolean domain sum", schema: goodSchema + "CREATE DOMAIN yes AS boolean; ALTER TABLE likes ADD COLUMN up yes;",
			counter: func(c *counter.Counter) { c.Sum = "up" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "summed column public.likes.up is yes, a domain over boolean",
			fix: "ALTER TABLE public.likes ALTER COLUMN up TYPE boolean;"},
		{name: "generated sum derived", schema: goodSchema + "ALTER TABLE likes ADD COLUMN up int, ADD COLUMN down int, ADD COLUMN score int GENERATED ALWAYS AS (up - down) STORED;",
			counter: func(c *counter.Counter) { c.Sum = "score" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: "summed column public.likes.score is generated ((up - down)): walcount derives it from down, up"},
		{name: "generated sum not derivable", schema: goodSchema + "ALTER TABLE likes ADD COLUMN up int, ADD COLUMN half int GENERATED ALWAYS AS (up / 2) STORED;",
			counter: func(c *counter.Counter) { c.Sum = "half" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: `summed column public.likes.half is a generated column, which the WAL does not carry`,
			fix: "sum a column the application writes (make public.likes.half a regular column, or sum the columns it is computed from with one counter each), or write its expression with integer columns, constants, +, - and * only"},
		{name: "total with no key", schema: goodSchema + "INSERT INTO posts (id) VALUES (1);",
			counter: func(c *counter.Counter) { c.Key, c.TargetRow = "", "1" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: "every counted row of public.likes counts into public.posts.likes_count (bigint) of the row whose id is 1"},
		{name: "total with no key and no row", schema: goodSchema,
			counter: func(c *counter.Counter) { c.Key, c.TargetRow = "", "1" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "public.posts has no row whose id is 1: the total has nowhere to go",
			fix: "INSERT INTO public.posts (id) VALUES ('1'); then walcount reconcile"},
		{name: "total with a row written otherwise", schema: goodSchema + "INSERT INTO posts (id) VALUES (1);",
			counter: func(c *counter.Counter) { c.Key, c.TargetRow = "", "01" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: `target_row "01" is written otherwise than PostgreSQL prints it (1)`,
			fix: "set counters[0].target_row in the config file to 1"},
		{name: "append_only source without the key in its identity",
			schema:  appschema.SQL(appschema.Options{DefaultIdentity: true}),
			counter: func(c *counter.Counter) { c.AppendOnly = true },
			check:   preflight.CheckReplicaIdentity, sev: preflight.OK, msg: "public.likes is append_only: its replica identity need not carry the counter's columns"},
		{name: "append_only source without any identity",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0); CREATE TABLE likes (post_id bigint NOT NULL);",
			counter: func(c *counter.Counter) { c.AppendOnly = true },
			check:   preflight.CheckReplicaIdentity, sev: preflight.OK, msg: "public.likes is append_only: it needs no replica identity"},
		{name: "max of a timestamptz",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, last_liked timestamptz); CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, at timestamptz); CREATE INDEX ON likes (post_id, at);",
			counter: func(c *counter.Counter) { c.Column, c.Max = "last_liked", "at" },
			check:   preflight.CheckIndex, sev: preflight.OK, msg: "counter post_likes: an index on public.likes (post_id, at) finds a key's max when its rows change"},
		{name: "max without its index",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, last_liked timestamptz); CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, at timestamptz); CREATE INDEX ON likes (post_id);",
			counter: func(c *counter.Counter) { c.Column, c.Max = "last_liked", "at" },
			check:   preflight.CheckIndex, sev: preflight.Warning, msg: "counter post_likes: no index on public.likes (post_id, at): when a key's rows change, the flush finds its max again by reading every row of the key",
			fix: "CREATE INDEX CONCURRENTLY ON public.likes (post_id, at);"},
		{name: "max whose key is the primary key",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, last_liked timestamptz); CREATE TABLE likes (id bigint PRIMARY KEY, at timestamptz);",
			counter: func(c *counter.Counter) { c.Key, c.Column, c.Max = "id", "last_liked", "at" },
			check:   preflight.CheckIndex, sev: preflight.OK, msg: "counter post_likes: public.likes has one row per id (a unique index on id alone): the flush reads a key's max from that row"},
		{name: "max whose key is unique only in part of the table",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, last_liked timestamptz); CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, at timestamptz, live boolean); CREATE UNIQUE INDEX ON likes (post_id) WHERE live;",
			counter: func(c *counter.Counter) { c.Column, c.Max = "last_liked", "at" },
			check:   preflight.CheckIndex, sev: preflight.Warning, msg: "counter post_likes: no index on public.likes (post_id, at)"},
		{name: "min of a text column",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, first_name text); CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, name text);",
			counter: func(c *counter.Counter) { c.Column, c.Min = "first_name", "name" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "counter post_likes: min column public.likes.name is text: it must be smallint, integer, bigint, numeric, date, timestamp or timestamptz",
			fix: "set counters[0].min in the config file to a column of one of those types"},
		{name: "max into a column of another type",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, last_liked timestamp); CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, at timestamptz);",
			counter: func(c *counter.Counter) { c.Column, c.Max = "last_liked", "at" },
			check:   preflight.CheckColumn, sev: preflight.Problem, msg: "counter post_likes: counter column public.posts.last_liked is timestamp without time zone but its max column public.likes.at is timestamp with time zone: it must hold the same type",
			fix: "ALTER TABLE public.posts ALTER COLUMN last_liked TYPE timestamp with time zone;"},
		{name: "max column outside the replica identity",
			schema:  "CREATE TABLE posts (id bigint PRIMARY KEY, last_liked timestamptz); CREATE TABLE likes (post_id bigint NOT NULL, at timestamptz, PRIMARY KEY (post_id));",
			counter: func(c *counter.Counter) { c.Column, c.Max = "last_liked", "at" },
			check:   preflight.CheckReplicaIdentity, sev: preflight.Problem, msg: "replica identity of public.likes is DEFAULT, the primary key (post_id), which does not contain at: its UPDATEs and DELETEs cannot be attributed",
			fix: "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
		{name: "quoted names", schema: `CREATE TABLE "Posts" ("ID" bigint PRIMARY KEY, "Likes" bigint NOT NULL);
CREATE TABLE likes (post_id bigint PRIMARY KEY);`,
			counter: func(c *counter.Counter) { c.Target, c.TargetKey, c.Column = `"Posts"`, "ID", "Likes" },
			check:   preflight.CheckColumn, sev: preflight.OK, msg: `counts into public."Posts"."Likes" (bigint), matched on "ID" (bigint)`},
		{name: "key without index",
			schema: "CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL); CREATE TABLE likes (id bigint PRIMARY KEY, post_id bigint NOT NULL);",
			check:  preflight.CheckIndex, sev: preflight.Warning, msg: "no index on public.likes (post_id)",
			fix: "CREATE INDEX CONCURRENTLY ON public.likes (post_id);"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, tt.schema)
			if tt.counter != nil {
				tt.counter(&f.cfg.Counters[0])
			}
			findings := run(t, f.cfg)
			fd := want(t, findings, tt.check, tt.sev, tt.msg)
			if tt.fix != "" {
				wantFix(t, fd, tt.fix)
			}
		})
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	t.Run("unreachable", func(t *testing.T) {
		// A port that was free a moment ago: nothing listens there.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		addr := l.Addr().String()
		l.Close()
		f := newFixture(t, goodSchema)
		f.cfg.RedisURL = "redis://" + addr + "/0"
		findings := run(t, f.cfg) // no error: Redis being down is a finding
		want(t, findings, preflight.CheckRedis, preflight.Problem, "Redis at "+addr+" does not answer PING")
		none(t, findings, preflight.CheckRedisWritable, preflight.OK)
	})
	t.Run("evicting policy", func(t *testing.T) {
		r := testenv.Redis(t)
		client := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer client.Close()
		if err := client.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatalf("CONFIG SET: %v", err)
		}
		f := newFixture(t, goodSchema)
		f.cfg.RedisURL = r.URL()
		findings := run(t, f.cfg)
		want(t, findings, preflight.CheckRedisWritable, preflight.OK, "accepts writes")
		want(t, findings, preflight.CheckRedisEviction, preflight.Warning, "maxmemory-policy allkeys-lru")
	})
	t.Run("evicting policy with a limit", func(t *testing.T) {
		r := testenv.Redis(t)
		client := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer client.Close()
		for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "volatile-lru"}} {
			if err := client.ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
				t.Fatalf("CONFIG SET: %v", err)
			}
		}
		f := newFixture(t, goodSchema)
		f.cfg.RedisURL = r.URL()
		findings := run(t, f.cfg)
		p := want(t, findings, preflight.CheckRedisEviction, preflight.Problem, "maxmemory-policy volatile-lru with maxmemory 104857600 bytes")
		wantFix(t, p, "CONFIG SET maxmemory-policy noeviction (and the same in redis.conf), or give walcount a Redis of its own")
	})
	t.Run("read-only replica", func(t *testing.T) {
		r := testenv.Redis(t)
		client := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer client.Close()
		// A replica of a primary that does not exist still refuses writes.
		if err := client.ReplicaOf(context.Background(), "127.0.0.1", "1").Err(); err != nil {
			t.Fatalf("REPLICAOF: %v", err)
		}
		f := newFixture(t, goodSchema)
		f.cfg.RedisURL = r.URL()
		findings := run(t, f.cfg)
		want(t, findings, preflight.CheckRedis, preflight.OK, "answers PING")
		want(t, findings, preflight.CheckRedisWritable, preflight.Problem, "does not accept writes")
	})
}

func TestPostgresUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := config.Default()
	cfg.DatabaseURL = fmt.Sprintf("postgres://postgres:secret@127.0.0.1:%d/postgres?connect_timeout=5", port)
	cfg.RedisURL = "redis://127.0.0.1:1/0"
	findings, err := preflight.Run(context.Background(), preflight.Options{Config: cfg})
	if err == nil {
		t.Fatalf("Run = %v, nil; want an error", findings)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error shows the password: %v", err)
	}
}

// walcountRole creates a role with LOGIN, REPLICATION and exactly the
// grants check asks for on goodSchema's tables and walcount's state, and
// returns its name and a Config that connects as it.
func walcountRole(t *testing.T, f *fixture) (string, config.Config) {
	t.Helper()
	role := fmt.Sprintf("preflight_rls_%d_%d", os.Getpid(), slotSeq.Add(1))
	f.exec(t, "CREATE ROLE "+role+" LOGIN REPLICATION")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = f.conn.Exec(ctx, "DROP ROLE "+role)
	})
	f.exec(t, "GRANT SELECT ON likes TO "+role)
	f.exec(t, "GRANT SELECT (id, likes_count), UPDATE (likes_count) ON posts TO "+role)
	f.exec(t, "GRANT USAGE ON SCHEMA walcount TO "+role)
	f.exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO "+role)
	f.exec(t, "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO "+role)
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	u.User = url.User(role)
	cfg := f.cfg
	cfg.DatabaseURL = u.String()
	return role, cfg
}

// TestRowSecurity: a policy that hides rows of the source or the target
// from walcount's role is a problem (exit status 1, like a missing
// privilege) with the fix; BYPASSRLS, or a permissive policy USING (true)
// for the role, makes it measurable; FORCE ROW LEVEL SECURITY applies to a
// role that owns the table.
func TestRowSecurity(t *testing.T) {
	t.Parallel()
	f := newFixture(t, goodSchema)
	f.setUp(t)
	role, cfg := walcountRole(t, f)
	gate := func(t *testing.T, findings []preflight.Finding) {
		t.Helper()
		var ref *preflight.Refusal
		if err := preflight.Gate(findings); !errors.As(err, &ref) {
			t.Fatalf("Gate = %v, want a refusal", err)
		} else if ref.ConfigProblem() {
			t.Error("row-level security is classified as a configuration problem (exit 2); it is the database's to fix, like a privilege")
		}
	}
	clean := func(t *testing.T) {
		t.Helper()
		findings := run(t, cfg)
		none(t, findings, preflight.CheckRowSecurity, preflight.Problem)
		if preflight.HasProblems(findings) {
			t.Error("problems remain")
		}
	}
	clean(t)

	f.exec(t, "ALTER TABLE likes ENABLE ROW LEVEL SECURITY")
	f.exec(t, "CREATE POLICY tenant ON likes USING (user_id = current_setting('app.user_id', true)::bigint)")
	t.Run("a tenant policy on the source", func(t *testing.T) {
		findings := run(t, cfg)
		p := want(t, findings, preflight.CheckRowSecurity, preflight.Problem, "row-level security is enabled on public.likes and applies to role "+role)
		if !strings.Contains(p.Message, "none is a permissive one USING (true) for SELECT") {
			t.Errorf("the message does not say what is missing: %s", p.Message)
		}
		wantFix(t, p, "ALTER ROLE "+role+" BYPASSRLS; (as a superuser) or CREATE POLICY walcount_all ON public.likes FOR SELECT TO "+role+" USING (true);")
		gate(t, findings)
	})
	t.Run("a permissive policy that only looks like true", func(t *testing.T) {
		f.exec(t, "CREATE POLICY nearly ON likes FOR SELECT TO "+role+" USING (1 = 1)")
		defer f.exec(t, "DROP POLICY nearly ON likes")
		want(t, run(t, cfg), preflight.CheckRowSecurity, preflight.Problem, "public.likes")
	})
	t.Run("a policy USING (true) for the role", func(t *testing.T) {
		f.exec(t, "CREATE POLICY walcount_all ON likes FOR SELECT TO "+role+" USING (true)")
		want(t, run(t, cfg), preflight.CheckRowSecurity, preflight.OK, "a policy USING (true) lets it see every row")
		clean(t)
	})
	t.Run("and a restrictive policy", func(t *testing.T) {
		f.exec(t, "CREATE POLICY recent ON likes AS RESTRICTIVE FOR SELECT USING (id > 0)")
		defer f.exec(t, "DROP POLICY recent ON likes")
		p := want(t, run(t, cfg), preflight.CheckRowSecurity, preflight.Problem, "restrictive policy recent applies")
		if !strings.Contains(p.Fix, "drop or widen restrictive policy recent") {
			t.Errorf("fix %q does not name the restrictive policy", p.Fix)
		}
	})
	t.Run("on the target", func(t *testing.T) {
		f.exec(t, "ALTER TABLE posts ENABLE ROW LEVEL SECURITY")
		f.exec(t, "CREATE POLICY sel ON posts FOR SELECT TO "+role+" USING (true)")
		defer f.exec(t, "ALTER TABLE posts DISABLE ROW LEVEL SECURITY")
		p := want(t, run(t, cfg), preflight.CheckRowSecurity, preflight.Problem, "on public.posts")
		if !strings.Contains(p.Message, "for SELECT and for UPDATE") || !strings.Contains(p.Message, "the flush could not update the rows it does not see") {
			t.Errorf("the message does not say why the target matters: %s", p.Message)
		}
		wantFix(t, p, "ALTER ROLE "+role+" BYPASSRLS; (as a superuser) or CREATE POLICY walcount_all ON public.posts FOR ALL TO "+role+" USING (true) WITH CHECK (true);")
		f.exec(t, "CREATE POLICY upd ON posts FOR UPDATE TO "+role+" USING (true)")
		findings := run(t, cfg)
		none(t, findings, preflight.CheckRowSecurity, preflight.Problem)
	})
	f.exec(t, "DROP POLICY walcount_all ON likes")

	t.Run("FORCE ROW LEVEL SECURITY on a table the role owns", func(t *testing.T) {
		f.exec(t, "ALTER TABLE likes OWNER TO "+role)
		want(t, run(t, cfg), preflight.CheckRowSecurity, preflight.OK, "row-level security of public.likes does not apply to role "+role)
		f.exec(t, "ALTER TABLE likes FORCE ROW LEVEL SECURITY")
		findings := run(t, cfg)
		p := want(t, findings, preflight.CheckRowSecurity, preflight.Problem, "although it owns the table, because of FORCE ROW LEVEL SECURITY")
		wantFix(t, p, "ALTER ROLE "+role+" BYPASSRLS; (as a superuser) or CREATE POLICY walcount_all ON public.likes FOR SELECT TO "+role+" USING (true); or ALTER TABLE public.likes NO FORCE ROW LEVEL SECURITY;")
		gate(t, findings)
		f.exec(t, "ALTER ROLE "+role+" BYPASSRLS")
		clean(t)
	})
}

// TestUnlogged: an UNLOGGED source, or an unlogged partition of one, is
// never in the WAL: a configuration problem (exit status 2) with the fix.
func TestUnlogged(t *testing.T) {
	t.Parallel()
	f := newFixture(t, `
CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE likes (id bigint NOT NULL, post_id bigint NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE likes_1 PARTITION OF likes FOR VALUES FROM (0) TO (1000);
CREATE UNLOGGED TABLE likes_2 PARTITION OF likes FOR VALUES FROM (1000) TO (2000);
ALTER TABLE likes_1 REPLICA IDENTITY FULL;
ALTER TABLE likes_2 REPLICA IDENTITY FULL;
CREATE INDEX ON likes (post_id);
CREATE UNLOGGED TABLE plain_likes (id bigint PRIMARY KEY, post_id bigint NOT NULL);`)
	f.setUpWith(t, "CREATE PUBLICATION walcount FOR TABLE likes, posts, walcount.messages WITH (publish_via_partition_root = true)")
	refused := func(t *testing.T, findings []preflight.Finding) {
		t.Helper()
		var ref *preflight.Refusal
		if err := preflight.Gate(findings); !errors.As(err, &ref) {
			t.Fatalf("Gate = %v, want a refusal", err)
		} else if !ref.ConfigProblem() {
			t.Error("an unlogged source is not a configuration problem (exit 2)")
		}
	}

	t.Run("an unlogged partition", func(t *testing.T) {
		findings := run(t, f.cfg)
		p := want(t, findings, preflight.CheckLogged, preflight.Problem, "source public.likes has UNLOGGED partitions (public.likes_2): its changes are not in the WAL")
		wantFix(t, p, "ALTER TABLE public.likes_2 SET LOGGED;")
		refused(t, findings)
	})
	t.Run("an unlogged table", func(t *testing.T) {
		cfg := f.cfg
		cfg.Counters = []counter.Counter{{Name: "plain", Source: "plain_likes", Key: "post_id", Target: "posts", TargetKey: "id", Column: "likes_count"}}
		findings := run(t, cfg)
		p := want(t, findings, preflight.CheckLogged, preflight.Problem, "source public.plain_likes is UNLOGGED")
		wantFix(t, p, "ALTER TABLE public.plain_likes SET LOGGED;")
		refused(t, findings)
	})
	t.Run("set logged", func(t *testing.T) {
		f.exec(t, "ALTER TABLE likes_2 SET LOGGED")
		findings := run(t, f.cfg)
		none(t, findings, preflight.CheckLogged, preflight.Problem)
		if preflight.HasProblems(findings) {
			t.Error("problems remain")
		}
	})
}

// TestTargetRules: check reports a trigger that fires on the flush's
// UPDATE of the counter column and a CHECK constraint over it, with what
// they mean for walcount; a trigger on other columns only is not reported.
func TestTargetRules(t *testing.T) {
	t.Parallel()
	f := newFixture(t, goodSchema+`
ALTER TABLE posts ADD COLUMN archived boolean NOT NULL DEFAULT false, ADD COLUMN title text,
  ADD CONSTRAINT likes_not_negative CHECK (likes_count >= 0);
CREATE FUNCTION posts_read_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF OLD.archived THEN RAISE EXCEPTION 'post % is archived', OLD.id; END IF; RETURN NEW; END $$;
CREATE TRIGGER posts_read_only BEFORE UPDATE ON posts FOR EACH ROW EXECUTE FUNCTION posts_read_only();
CREATE TRIGGER posts_title AFTER UPDATE OF title ON posts FOR EACH ROW EXECUTE FUNCTION posts_read_only();`)
	findings := run(t, f.cfg)
	tr := want(t, findings, preflight.CheckTargetRules, preflight.Warning,
		"trigger posts_read_only (BEFORE UPDATE, for each row) on public.posts fires for every flush's update of public.posts.likes_count")
	if !strings.Contains(tr.Message, "parks those keys") || !strings.Contains(tr.Fix, "UPDATE OF <the other columns>") {
		t.Errorf("trigger finding does not say what it means or how to fix it: %+v", tr)
	}
	want(t, findings, preflight.CheckTargetRules, preflight.Warning,
		"CHECK constraint likes_not_negative on public.posts.likes_count (CHECK ((likes_count >= 0)))")
	for _, fd := range findings {
		if strings.Contains(fd.Message, "posts_title") {
			t.Errorf("a trigger on other columns only is reported: %s", fd.Message)
		}
	}
	g := newFixture(t, goodSchema)
	none(t, run(t, g.cfg), preflight.CheckTargetRules, preflight.Warning)
}

// TestRoleTimeouts: lock_timeout, statement_timeout and
// idle_in_transaction_session_timeout of 1 ms on walcount's role in the
// database neither fail the checks (walcount run makes them first) nor
// go unreported: walcount sets its own for its sessions.
func TestRoleTimeouts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, goodSchema)
	f.setUp(t)
	role := fmt.Sprintf("preflight_to_%d_%d", os.Getpid(), slotSeq.Add(1))
	f.exec(t, "CREATE ROLE "+role+" LOGIN REPLICATION")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = f.conn.Exec(ctx, "DROP ROLE "+role)
	})
	f.exec(t, "GRANT SELECT ON likes TO "+role)
	f.exec(t, "GRANT SELECT (id, likes_count), UPDATE (likes_count) ON posts TO "+role)
	f.exec(t, state.AccessGrants(role))
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	db := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	for _, s := range []string{"lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"} {
		f.exec(t, fmt.Sprintf("ALTER ROLE %s IN DATABASE %s SET %s = '1ms'", role, db, s))
	}
	u.User = url.User(role)
	cfg := f.cfg
	cfg.DatabaseURL = u.String()
	findings := run(t, cfg)
	if preflight.HasProblems(findings) {
		t.Error("the role's timeouts made checks fail")
	}
}
