package setup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/state"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// schema is the app's tables, whose sources have the default identity.
var schema = appschema.SQL(appschema.Options{DefaultIdentity: true}) + `
CREATE TABLE users (id bigint PRIMARY KEY, comments_count bigint NOT NULL DEFAULT 0, followers_count bigint NOT NULL DEFAULT 0);
CREATE TABLE comments (id bigserial PRIMARY KEY, user_id bigint NOT NULL);
CREATE TABLE follows (follower_id bigint, followee_id bigint, PRIMARY KEY (followee_id, follower_id));
`

var (
	likes    = counter.Default()
	comments = counter.Counter{Name: "user_comments", Source: "public.comments", Key: "user_id",
		Target: "public.users", TargetKey: "id", Column: "comments_count"}
	follows = counter.Counter{Name: "followers", Source: "follows", Key: "followee_id",
		Target: "users", TargetKey: "id", Column: "followers_count"}
)

var slotSeq atomic.Int64

// fixture is a fresh database on the shared cluster with schema, and a
// slot name of its own (slots are cluster-wide).
type fixture struct {
	conn  *pgx.Conn
	url   string
	redis string
	slot  string
}

func newFixture(t *testing.T, url string) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	return &fixture{conn: conn, url: url, redis: testenv.RedisURL(t), slot: fmt.Sprintf("setup_%d_%d", os.Getpid(), slotSeq.Add(1))}
}

func (f *fixture) opts(counters ...counter.Counter) setup.Options {
	cfg := config.Default()
	cfg.DatabaseURL, cfg.RedisURL, cfg.Slot, cfg.Counters = f.url, f.redis, f.slot, counters
	// The schema's sources have the default identity; setup refuses them
	// unless asked to fix it (TestFixReplicaIdentityOnlyWhenAsked).
	return setup.Options{Config: cfg, FixReplicaIdentity: true}
}

func (f *fixture) run(t *testing.T, opt setup.Options) setup.Result {
	t.Helper()
	res, err := setup.Run(context.Background(), f.conn, opt)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return res
}

func (f *fixture) query(t *testing.T, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := f.conn.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// published returns the publication's tables, sorted.
func (f *fixture) published(t *testing.T) []string {
	t.Helper()
	rows, err := f.conn.Query(context.Background(),
		"SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'walcount' ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return tables
}

func (f *fixture) checkpoint(t *testing.T) string {
	t.Helper()
	return f.query(t, "SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1", f.slot)
}

func TestSetupIsIdempotent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	first := f.run(t, f.opts(likes))
	if !first.CreatedSlot || first.CheckpointLSN == "" || first.NeedsReconcile {
		t.Fatalf("first setup = %+v; want a new slot and a checkpoint, no reconcile", first)
	}
	if got := f.query(t, "SELECT plugin FROM pg_replication_slots WHERE slot_name = $1", f.slot); got != "pgoutput" {
		t.Fatalf("slot plugin = %s", got)
	}
	if got := f.checkpoint(t); got != first.CheckpointLSN {
		t.Fatalf("checkpoint = %s, setup said %s", got, first.CheckpointLSN)
	}
	// Traffic moves the server on; a second setup keeps slot and W.
	f.exec(t, "INSERT INTO likes (post_id) SELECT g FROM generate_series(1, 100) g")
	for range 2 {
		again := f.run(t, f.opts(likes))
		if again.CreatedSlot || again.NeedsReconcile || again.CheckpointLSN != first.CheckpointLSN {
			t.Fatalf("setup again = %+v; want nothing new and the checkpoint kept at %s", again, first.CheckpointLSN)
		}
	}
	if got := f.query(t, "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1", f.slot); got != "1" {
		t.Fatalf("%s slots", got)
	}
	if got := f.published(t); !slices.Equal(got, []string{"public.likes", "public.posts", "walcount.messages"}) {
		t.Fatalf("published = %v", got)
	}

	// A checkpoint row lost while the slot stays is recreated at the
	// slot's confirmed position.
	f.exec(t, "DELETE FROM walcount.checkpoint")
	res := f.run(t, f.opts(likes))
	want := f.query(t, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", f.slot)
	if res.CheckpointLSN != want || f.checkpoint(t) != want {
		t.Fatalf("checkpoint = %s, want the slot's %s", res.CheckpointLSN, want)
	}
}

func TestPublicationFollowsCounters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	steps := []struct {
		counters []counter.Counter
		want     []string
	}{
		{[]counter.Counter{likes}, []string{"public.likes", "public.posts", "walcount.messages"}},
		{[]counter.Counter{likes, comments}, []string{"public.comments", "public.likes", "public.posts", "public.users", "walcount.messages"}},
		{[]counter.Counter{likes, comments, follows}, []string{"public.comments", "public.follows", "public.likes", "public.posts", "public.users", "walcount.messages"}},
		{[]counter.Counter{comments}, []string{"public.comments", "public.users", "walcount.messages"}},
		{[]counter.Counter{follows, likes}, []string{"public.follows", "public.likes", "public.posts", "public.users", "walcount.messages"}},
	}
	for i, s := range steps {
		// Setup takes counters as Load leaves them: validated.
		cfg := config.Default()
		cfg.Counters = slices.Clone(s.counters)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		opt := f.opts(cfg.Counters...)
		opt.FixReplicaIdentity = true
		f.run(t, opt)
		if got := f.published(t); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: published = %v, want %v", i, got, s.want)
		}
	}
	// Every operation is published: TRUNCATE is a barrier.
	if got := f.query(t, "SELECT format('%s%s%s%s', pubinsert, pubupdate, pubdelete, pubtruncate) FROM pg_publication WHERE pubname = 'walcount'"); got != "tttt" {
		t.Fatalf("publication publishes insert/update/delete/truncate = %s", got)
	}
}

func TestPrintSQL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	f.exec(t, "ALTER TABLE comments REPLICA IDENTITY DEFAULT")
	var out bytes.Buffer
	opt := f.opts(likes, comments)
	opt.PrintSQL, opt.Out, opt.FixReplicaIdentity = true, &out, true
	res := f.run(t, opt)
	got := out.String()
	t.Logf("setup --print-sql:\n%s", got)
	for _, want := range []string{
		"CREATE SCHEMA IF NOT EXISTS walcount;\n",
		"CREATE TABLE IF NOT EXISTS walcount.checkpoint",
		`ALTER TABLE "public"."comments" REPLICA IDENTITY FULL;`,
		`ALTER TABLE "public"."likes" REPLICA IDENTITY FULL;`,
		`CREATE PUBLICATION "walcount" FOR TABLE "public"."comments", "public"."likes", "public"."posts"`,
		"pg_create_logical_replication_slot('" + f.slot + "', 'pgoutput'",
		"INSERT INTO walcount.checkpoint",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if len(res.Statements) == 0 {
		t.Error("Result.Statements is empty")
	}
	// Nothing was run.
	if n := f.query(t, "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'"); n != "0" {
		t.Error("the schema was created")
	}
	if n := f.query(t, "SELECT count(*)::text FROM pg_publication"); n != "0" {
		t.Error("a publication was created")
	}
	if n := f.query(t, "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1", f.slot); n != "0" {
		t.Error("the slot was created")
	}
	if id := f.query(t, "SELECT relreplident::text FROM pg_class WHERE oid = 'likes'::regclass"); id != "d" {
		t.Errorf("likes identity = %s: --print-sql changed it", id)
	}

	// Once set up, --print-sql shows what would change: the publication
	// follows the counters.
	opt = f.opts(likes)
	opt.FixReplicaIdentity = true
	f.run(t, opt)
	out.Reset()
	opt = f.opts(likes, comments)
	opt.PrintSQL, opt.Out = true, &out
	f.run(t, opt)
	if !strings.Contains(out.String(), `ALTER PUBLICATION "walcount" SET TABLE "public"."comments", "public"."likes", "public"."posts"`) {
		t.Errorf("print-sql after setup:\n%s", out.String())
	}
	if strings.Contains(out.String(), "pg_create_logical_replication_slot") {
		t.Errorf("print-sql would create the existing slot again:\n%s", out.String())
	}
	if got := f.published(t); !slices.Equal(got, []string{"public.likes", "public.posts", "walcount.messages"}) {
		t.Errorf("published = %v: --print-sql changed the publication", got)
	}
}

func TestWALLevelReplicaIsRefused(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t, servers.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}})
	f := newFixture(t, pg.URL())
	_, err := setup.Run(context.Background(), f.conn, f.opts(likes))
	if !errors.Is(err, setup.ErrNoLogicalReplication) {
		t.Fatalf("err = %v, want ErrNoLogicalReplication", err)
	}
	for _, want := range []string{`wal_level is "replica"`, "ALTER SYSTEM SET wal_level = logical", "restart PostgreSQL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := f.query(t, "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'"); n != "0" {
		t.Error("setup created its schema on a server it refused")
	}
}

func TestRecreateSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	first := f.run(t, f.opts(likes))
	f.exec(t, "INSERT INTO likes (post_id) SELECT g FROM generate_series(1, 100) g")

	opt := f.opts(likes)
	opt.RecreateSlot = true
	res := f.run(t, opt)
	if !res.CreatedSlot || !res.NeedsReconcile {
		t.Fatalf("recreate = %+v; want a new slot that needs a reconcile", res)
	}
	if res.CheckpointLSN == first.CheckpointLSN || f.checkpoint(t) != res.CheckpointLSN {
		t.Fatalf("checkpoint = %s (was %s, setup said %s): it must move to the new slot", f.checkpoint(t), first.CheckpointLSN, res.CheckpointLSN)
	}
	if got := f.query(t, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", f.slot); got != res.CheckpointLSN {
		t.Fatalf("new slot confirmed %s, checkpoint %s", got, res.CheckpointLSN)
	}

	// A slot of another plugin is refused unless it is recreated.
	f.exec(t, "SELECT pg_drop_replication_slot($1)", f.slot)
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", f.slot)
	_, err := setup.Run(context.Background(), f.conn, f.opts(likes))
	if err == nil || !strings.Contains(err.Error(), `uses plugin test_decoding, not pgoutput`) || !strings.Contains(err.Error(), "walcount setup --recreate-slot") {
		t.Fatalf("setup on a test_decoding slot: err = %v", err)
	}
	f.run(t, opt)
	if got := f.query(t, "SELECT plugin FROM pg_replication_slots WHERE slot_name = $1", f.slot); got != "pgoutput" {
		t.Fatalf("plugin after --recreate-slot = %s", got)
	}
}

func TestFixReplicaIdentityOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	identity := func(table string) string {
		return f.query(t, "SELECT relreplident::text FROM pg_class WHERE oid = $1::regclass", table)
	}
	counters := []counter.Counter{likes, comments, follows}

	// Not asked: setup refuses, as run would, and creates nothing.
	notAsked := f.opts(counters...)
	notAsked.FixReplicaIdentity = false
	_, err := setup.Run(context.Background(), f.conn, notAsked)
	var ref *preflight.Refusal
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "replica identity of public.likes is DEFAULT") ||
		!strings.Contains(err.Error(), "ALTER TABLE public.likes REPLICA IDENTITY FULL;") {
		t.Fatalf("setup without --fix-replica-identity: err = %v, want the refusal naming the identity and its fix", err)
	}
	// A new operator's first setup on a plain likes table: the refusal names
	// the flag that fixes it.
	if !strings.Contains(err.Error(), "walcount setup --fix-replica-identity") {
		t.Errorf("setup without --fix-replica-identity does not name the flag: %v", err)
	}
	for _, tbl := range []string{"likes", "comments", "follows"} {
		if got := identity(tbl); got != "d" {
			t.Fatalf("%s identity = %s without --fix-replica-identity", tbl, got)
		}
	}
	for what, sql := range map[string]string{
		"schema":      "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'",
		"publication": "SELECT count(*)::text FROM pg_publication",
		"slot":        "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'",
	} {
		if n := f.query(t, sql); n != "0" {
			t.Errorf("a refused setup left a %s", what)
		}
	}

	opt := f.opts(counters...)
	res := f.run(t, opt)
	if want := []string{`"public"."comments"`, `"public"."likes"`}; !slices.Equal(res.FixedIdentityTable, want) {
		t.Fatalf("fixed %v, want %v", res.FixedIdentityTable, want)
	}
	// follows' primary key contains its key column: it is left alone.
	for tbl, want := range map[string]string{"likes": "f", "comments": "f", "follows": "d"} {
		if got := identity(tbl); got != want {
			t.Errorf("%s identity = %s, want %s", tbl, got, want)
		}
	}
	// Asking again changes nothing.
	if res = f.run(t, opt); len(res.FixedIdentityTable) != 0 {
		t.Fatalf("fixed %v again", res.FixedIdentityTable)
	}
}

func TestTeardown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	f.run(t, f.opts(likes))
	ropt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(ropt)
	defer rdb.Close()
	ctx := context.Background()
	keys := buffer.KeysFor(f.slot)
	if err := rdb.HSet(ctx, keys.Buffer, "post_likes:1", 3).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, keys.Meta, "lsn", "0000000000000010").Err(); err != nil {
		t.Fatal(err)
	}
	other := "walcount:{other}:buffer"
	if err := rdb.HSet(ctx, other, "x:1", 1).Err(); err != nil {
		t.Fatal(err)
	}

	plan := strings.Join(setup.TeardownPlan(f.slot, "walcount"), "\n")
	for _, want := range []string{f.slot, "DROP PUBLICATION", "DROP SCHEMA walcount CASCADE", keys.Buffer} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan lacks %q:\n%s", want, plan)
		}
	}

	for range 2 { // idempotent
		if _, err := setup.Teardown(ctx, f.conn, rdb, f.slot, "walcount"); err != nil {
			t.Fatalf("teardown: %v", err)
		}
	}
	for what, sql := range map[string]string{
		"slot":        "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'",
		"publication": "SELECT count(*)::text FROM pg_publication WHERE pubname = 'walcount'",
		"schema":      "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'",
	} {
		if n := f.query(t, sql); n != "0" {
			t.Errorf("%s left after teardown", what)
		}
	}
	if n, err := rdb.Exists(ctx, keys.All()...).Result(); err != nil || n != 0 {
		t.Errorf("%d redis keys left after teardown (%v)", n, err)
	}
	if n, err := rdb.Exists(ctx, other).Result(); err != nil || n != 1 {
		t.Errorf("teardown dropped another slot's key (%v)", err)
	}
	// The app's tables are untouched.
	if n := f.query(t, "SELECT count(*)::text FROM pg_class WHERE relname IN ('likes', 'posts')"); n != "2" {
		t.Errorf("app tables left: %s of 2", n)
	}
}

// TestSetupRefusesWhatRunWould: setup runs the preflight gate first and
// leaves nothing behind when it refuses.
func TestSetupRefusesWhatRunWould(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	f.exec(t, "DROP TABLE likes")
	_, err := setup.Run(context.Background(), f.conn, f.opts(likes))
	var ref *preflight.Refusal
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "source table public.likes does not exist") {
		t.Fatalf("setup without the source table: err = %v, want a refusal naming it", err)
	}
	for what, sql := range map[string]string{
		"schema":      "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'",
		"publication": "SELECT count(*)::text FROM pg_publication",
		"slot":        "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'",
	} {
		if n := f.query(t, sql); n != "0" {
			t.Errorf("a refused setup left a %s", what)
		}
	}
}

// TestSetupPartitionedSource publishes a partitioned source through its
// root, so that run accepts the setup.
func TestSetupPartitionedSource(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	// The fixture's posts and likes again, with likes partitioned by the
	// day of the like.
	f.exec(t, "DROP TABLE likes, posts;\n"+appschema.SQL(appschema.Options{
		LikesColumns: "created date NOT NULL DEFAULT current_date", PartitionBy: "RANGE (created)", DefaultIdentity: true})+`
CREATE TABLE likes_old PARTITION OF likes FOR VALUES FROM ('2000-01-01') TO ('2026-01-01');
CREATE TABLE likes_new PARTITION OF likes FOR VALUES FROM ('2026-01-01') TO ('2100-01-01');`)
	opt := f.opts(likes)
	f.run(t, opt)
	if got := f.query(t, "SELECT pubviaroot::text FROM pg_publication WHERE pubname = 'walcount'"); got != "true" {
		t.Fatalf("publish_via_partition_root = %s, want true", got)
	}
	findings, err := preflight.Run(context.Background(), preflight.Options{Config: opt.Config})
	if err != nil {
		t.Fatal(err)
	}
	if err := preflight.Gate(findings); err != nil {
		t.Fatalf("run would refuse what setup made: %v", err)
	}
}

// TestSetupWithoutCreateOnTheDatabase: a role that may not create schemas
// can still set up (and set up again) once the schema exists, and a
// missing privilege is refused with the GRANT it needs.
func TestSetupWithoutCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	dbURL := testenv.Database(t)
	f := newFixture(t, dbURL)
	f.run(t, f.opts(likes)) // as the superuser: makes the schema
	role := fmt.Sprintf("setup_app_%d_%d", os.Getpid(), slotSeq.Add(1))
	f.exec(t, "CREATE ROLE "+role+" LOGIN REPLICATION")
	t.Cleanup(func() {
		_, _ = f.conn.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = f.conn.Exec(context.Background(), "DROP ROLE "+role)
	})
	f.exec(t, "REVOKE CREATE ON DATABASE "+pgx.Identifier{f.query(t, "SELECT current_database()")}.Sanitize()+" FROM PUBLIC")
	f.exec(t, "ALTER TABLE likes OWNER TO "+role)
	f.exec(t, "ALTER TABLE posts OWNER TO "+role)
	f.exec(t, "ALTER PUBLICATION walcount OWNER TO "+role)
	roleURL := strings.Replace(dbURL, "postgres@", role+"@", 1)
	conn, err := pgx.Connect(context.Background(), roleURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	opt := f.opts(likes)
	opt.Config.DatabaseURL = roleURL
	_, err = setup.Run(context.Background(), conn, opt)
	if err == nil || !strings.Contains(err.Error(), "GRANT USAGE ON SCHEMA walcount TO "+role) {
		t.Fatalf("setup without privileges on walcount's state: err = %v, want the GRANT it needs", err)
	}
	f.exec(t, state.AccessGrants(role))
	if _, err := setup.Run(context.Background(), conn, opt); err != nil {
		t.Fatalf("setup by a role without CREATE on the database, once the schema exists: %v", err)
	}
	// A later migration's table, made by the state's owner, needs no new
	// GRANT: the default privileges give it.
	f.exec(t, "CREATE TABLE walcount.later_migration (id bigserial PRIMARY KEY)")
	for _, priv := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
		if got := f.query(t, "SELECT has_table_privilege($1, 'walcount.later_migration', $2)::text", role, priv); got != "true" {
			t.Errorf("%s on a later migration's table: %s", priv, got)
		}
	}
	if got := f.query(t, "SELECT has_sequence_privilege($1, 'walcount.later_migration_id_seq', 'USAGE')::text", role); got != "true" {
		t.Errorf("USAGE on a later migration's sequence: %s", got)
	}
}

// TestSecondSlotOnAColumnIsRefused: one slot keeps each counter column; a
// second deployment is refused, and tearing it down leaves the first one
// whole.
func TestSecondSlotOnAColumnIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	first := f.opts(likes)
	f.run(t, first)
	second := f.opts(likes)
	second.Config.Slot, second.Config.Publication = f.slot+"_b", "walcount_b"
	_, err := setup.Run(context.Background(), f.conn, second)
	if err == nil || !strings.Contains(err.Error(), "public.posts.likes_count is kept by slot "+f.slot) ||
		!strings.Contains(err.Error(), "walcount teardown --slot "+f.slot) {
		t.Fatalf("setup of a second slot on the same column: err = %v, want a refusal naming the owner and the way to move it", err)
	}
	if n := f.query(t, "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1", second.Config.Slot); n != "0" {
		t.Fatal("the refused second setup created a slot")
	}
	// Tearing the second deployment down touches nothing of the first.
	if _, err := setup.Teardown(context.Background(), f.conn, nil, second.Config.Slot, second.Config.Publication); err != nil {
		t.Fatal(err)
	}
	for what, sql := range map[string]string{
		"slot":        "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'",
		"publication": "SELECT count(*)::text FROM pg_publication WHERE pubname = 'walcount'",
		"checkpoint":  "SELECT count(*)::text FROM walcount.checkpoint WHERE slot_name = '" + f.slot + "'",
		"owner":       "SELECT count(*)::text FROM walcount.owners WHERE slot_name = '" + f.slot + "'",
		"runs table":  "SELECT (count(*) + 1)::text FROM walcount.reconcile_runs",
	} {
		if n := f.query(t, sql); n != "1" {
			t.Errorf("the first deployment's %s is gone after tearing down the second", what)
		}
	}
	// A deployment of other counters shares the schema; tearing the first
	// down keeps the schema for it.
	other := f.opts(comments)
	other.Config.Slot, other.Config.Publication = f.slot+"_c", "walcount_c"
	f.run(t, other)
	if _, err := setup.Teardown(context.Background(), f.conn, nil, f.slot, "walcount"); err != nil {
		t.Fatal(err)
	}
	if n := f.query(t, "SELECT count(*)::text FROM walcount.checkpoint WHERE slot_name = $1", other.Config.Slot); n != "1" {
		t.Fatal("tearing one deployment down removed another's checkpoint")
	}
	if n := f.query(t, "SELECT count(*)::text FROM pg_publication WHERE pubname = 'walcount'"); n != "0" {
		t.Error("the torn-down deployment's publication is left")
	}
}

// TestSetupMultiLevel: a counter that sums another counter's column
// (users.total_likes = SUM(posts.likes_count) per posts.user_id) makes
// posts both a target and a source. Without --fix-replica-identity setup
// refuses posts' default identity (its primary key carries neither user_id
// nor likes_count) with the fix; with it, posts gets FULL and is published
// whole, and run's checks pass on what setup made.
func TestSetupMultiLevel(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	f.exec(t, "ALTER TABLE posts ADD COLUMN user_id bigint; ALTER TABLE users ADD COLUMN total_likes bigint NOT NULL DEFAULT 0")
	level2 := counter.Counter{Name: "user_likes", Source: "posts", Key: "user_id", Target: "users", TargetKey: "id",
		Column: "total_likes", Sum: "likes_count"}
	notAsked := f.opts(likes, level2)
	notAsked.FixReplicaIdentity = false
	_, err := setup.Run(context.Background(), f.conn, notAsked)
	var ref *preflight.Refusal
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "replica identity of public.posts is DEFAULT") ||
		!strings.Contains(err.Error(), "ALTER TABLE public.posts REPLICA IDENTITY FULL;") {
		t.Fatalf("setup without --fix-replica-identity: err = %v, want the refusal naming posts' identity and its fix", err)
	}

	opt := f.opts(likes, level2)
	res := f.run(t, opt)
	if !slices.Contains(res.FixedIdentityTable, `"public"."posts"`) {
		t.Fatalf("fixed %v, want posts among them", res.FixedIdentityTable)
	}
	if want := []string{"public.likes", "public.posts", "public.users", "walcount.messages"}; !slices.Equal(f.published(t), want) {
		t.Fatalf("published %v, want %v", f.published(t), want)
	}
	// pg_publication_tables lists the published columns from 15 on.
	if f.query(t, "SELECT (current_setting('server_version_num')::int >= 150000)::text") == "true" &&
		f.query(t, "SELECT coalesce(array_length(attnames, 1), 0)::text FROM pg_publication_tables WHERE pubname = 'walcount' AND tablename = 'posts'") != "3" {
		t.Errorf("posts published with a column list, want all 3 columns (it is a source)")
	}
	findings, err := preflight.Run(context.Background(), preflight.Options{Config: opt.Config})
	if err != nil {
		t.Fatal(err)
	}
	if err := preflight.Gate(findings); err != nil {
		t.Fatalf("run would refuse what setup made: %v", err)
	}
}
