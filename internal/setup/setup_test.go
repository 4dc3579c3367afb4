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

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/config"
	"github.com/walcount/walcount/internal/servers"
	"github.com/walcount/walcount/internal/setup"
	"github.com/walcount/walcount/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const schema = `
CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL);
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
	conn *pgx.Conn
	slot string
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
	return &fixture{conn: conn, slot: fmt.Sprintf("setup_%d_%d", os.Getpid(), slotSeq.Add(1))}
}

func (f *fixture) opts(counters ...counter.Counter) setup.Options {
	return setup.Options{Slot: f.slot, Publication: "walcount", Counters: counters}
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
	if got := f.published(t); !slices.Equal(got, []string{"public.likes"}) {
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
		{[]counter.Counter{likes}, []string{"public.likes"}},
		{[]counter.Counter{likes, comments}, []string{"public.comments", "public.likes"}},
		{[]counter.Counter{likes, comments, follows}, []string{"public.comments", "public.follows", "public.likes"}},
		{[]counter.Counter{comments}, []string{"public.comments"}},
		{[]counter.Counter{follows, likes}, []string{"public.follows", "public.likes"}},
	}
	for i, s := range steps {
		// Setup takes counters as Load leaves them: validated.
		cfg := config.Default()
		cfg.Counters = slices.Clone(s.counters)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		f.run(t, f.opts(cfg.Counters...))
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
		`CREATE PUBLICATION "walcount" FOR TABLE "public"."comments", "public"."likes";`,
		"SELECT pg_create_logical_replication_slot('" + f.slot + "', 'pgoutput');",
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
	f.run(t, f.opts(likes))
	out.Reset()
	opt = f.opts(likes, comments)
	opt.PrintSQL, opt.Out = true, &out
	f.run(t, opt)
	if !strings.Contains(out.String(), `ALTER PUBLICATION "walcount" SET TABLE "public"."comments", "public"."likes";`) {
		t.Errorf("print-sql after setup:\n%s", out.String())
	}
	if strings.Contains(out.String(), "pg_create_logical_replication_slot") {
		t.Errorf("print-sql would create the existing slot again:\n%s", out.String())
	}
	if got := f.published(t); !slices.Equal(got, []string{"public.likes"}) {
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
	if err == nil || !strings.Contains(err.Error(), `uses plugin "test_decoding", not pgoutput; run walcount setup --recreate-slot`) {
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

	res := f.run(t, f.opts(counters...))
	if len(res.FixedIdentityTable) != 0 {
		t.Fatalf("fixed %v without being asked", res.FixedIdentityTable)
	}
	for _, tbl := range []string{"likes", "comments", "follows"} {
		if got := identity(tbl); got != "d" {
			t.Fatalf("%s identity = %s without --fix-replica-identity", tbl, got)
		}
	}

	opt := f.opts(counters...)
	opt.FixReplicaIdentity = true
	res = f.run(t, opt)
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
		if err := setup.Teardown(ctx, f.conn, rdb, f.slot, "walcount"); err != nil {
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
