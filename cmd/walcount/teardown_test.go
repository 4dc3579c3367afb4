package main

import (
	"context"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestTeardownDropsTheSlotOnTheStandby: with replication_url on a hot
// standby that decodes (PostgreSQL 16 and later), teardown --yes drops the
// slot there and says where; it used to leave it, pinning the standby's
// WAL and, through hot_standby_feedback, the primary's catalog xmin. A
// setup after it creates a new slot and walcount counts from it.
func TestTeardownDropsTheSlotOnTheStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	if pg.Major() < 16 {
		t.Skipf("decoding on a standby needs PostgreSQL 16 or later; WALCOUNT_TEST_PG selects %d", pg.Major())
	}
	standby, err := pg.StartStandby(ctx, servers.StandbyOptions{Settings: map[string]string{"recovery_min_apply_delay": "200ms"}})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	c := newCLI(t, pg.URL(), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;")
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REPLICATION_URL=" + standby.URL(), "WALCOUNT_REDIS_URL=" + c.redis,
		"WALCOUNT_SLOT=" + c.slot, "WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	onStandby := "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + c.slot + "'"
	if code, out, errOut := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := countOn(t, standby.URL(), onStandby); n != 1 {
		t.Fatalf("setup made %d slots named %s on the standby", n, c.slot)
	}

	code, out, errOut := walcount(t, env, "teardown", "--yes")
	if code != exitOK {
		t.Fatalf("teardown --yes: exit %d\n%s\n%s", code, out, errOut)
	}
	if want := `slot "` + c.slot + `" on the hot standby`; !strings.Contains(out, want) {
		t.Errorf("teardown does not say it dropped the slot on the standby (%q):\n%s", want, out)
	}
	if n := countOn(t, standby.URL(), onStandby); n != 0 {
		t.Fatalf("teardown left slot %s on the standby", c.slot)
	}
	if !strings.Contains(out, "kept on purpose") || !strings.Contains(out, `ALTER TABLE "public"."posts" DROP COLUMN "likes_count";`) {
		t.Errorf("teardown does not list what it keeps with the statements that remove it:\n%s", out)
	}

	// Installed again: a new slot, and counts made exact by the backfill.
	c.conn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 200) g`) //nolint:errcheck // checked by the count
	code, out, errOut = walcount(t, env, "setup")
	if code != exitOK || !strings.Contains(out, "created replication slot") {
		t.Fatalf("setup after teardown: exit %d, want 0 and a new slot\n%s\n%s", code, out, errOut)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	c.conn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 100) g`) //nolint:errcheck // checked by the count
	c.settlesExact(offPosts, "posts")
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d\n%s", code, p.stderr.String())
	}
}

// TestSetupNeverAdoptsAStaleSlot: a slot made before walcount's
// publication (by hand, or left by an earlier install) decodes changes
// from before the publication; on PostgreSQL before 18 the stream then
// fails at every retry with `publication "walcount" does not exist`.
// setup and check used to accept it. Now check reports it with the fix,
// setup drops it and makes it anew (and says so), and the counts come out
// exact. The same for a publication made again by hand while the state
// remembers the old one: check reports it, run stops with exit 2 and the
// command to run instead of retrying for good, and setup recreates the
// slot.
func TestSetupNeverAdoptsAStaleSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	c := newCLI(t, pg.URL(), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;")
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis,
		"WALCOUNT_SLOT=" + c.slot, "WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	like := func(n int) {
		t.Helper()
		if _, err := c.conn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, $1) g`, n); err != nil {
			t.Fatal(err)
		}
	}

	// 1. A slot older than the publication, unknown to walcount's state.
	if _, err := c.conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, c.slot); err != nil {
		t.Fatal(err)
	}
	like(50)
	code, out, _ := walcount(t, env, "check")
	if code == exitOK || !strings.Contains(out, "no checkpoint for replication slot "+c.slot) || !strings.Contains(out, "walcount setup (it drops the slot") {
		t.Errorf("check with a slot walcount's state does not know: exit %d, want a problem naming it and the fix\n%s", code, out)
	}
	code, out, errOut := walcount(t, env, "setup")
	if code != exitOK || !strings.Contains(out, "did not adopt the existing slot") || !strings.Contains(out, "created it anew") || strings.Contains(out, "exists; checkpoint") {
		t.Fatalf("setup with a stale slot: exit %d, want 0 and the slot made anew\n%s\n%s", code, out, errOut)
	}
	if code, out, _ := walcount(t, env, "check"); code != exitOK {
		t.Errorf("check after setup recreated the slot: exit %d\n%s", code, out)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	like(100)
	c.settlesExact(offPosts, "posts")
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d\n%s", code, p.stderr.String())
	}

	// 2. The publication made again by hand (as a DBA might, after
	// dropping it), with changes before it: the slot predates it.
	if _, err := c.conn.Exec(ctx, `DROP PUBLICATION walcount`); err != nil {
		t.Fatal(err)
	}
	like(30)
	if _, err := c.conn.Exec(ctx, `CREATE PUBLICATION walcount FOR TABLE public.likes, public.posts, walcount.messages`); err != nil {
		t.Fatal(err)
	}
	like(30)
	code, out, _ = walcount(t, env, "check")
	if code == exitOK || !strings.Contains(out, "publication walcount") || !strings.Contains(out, "walcount will not stream from it") {
		t.Errorf("check with a slot older than the publication: exit %d, want a problem that says so\n%s", code, out)
	}
	if pg.Major() < 18 {
		// PostgreSQL 18 skips a publication it cannot see yet.
		code, _, errOut = walcount(t, env, "run", "--skip-check")
		if code != exitUsage || !strings.Contains(errOut, `publication "walcount"`) || !strings.Contains(errOut, "walcount setup") {
			t.Errorf("run --skip-check on a slot older than the publication: exit %d, want %d and the fix\n%s", code, exitUsage, errOut)
		}
	}
	code, out, errOut = walcount(t, env, "setup")
	if code != exitOK || !strings.Contains(out, "did not adopt the existing slot") {
		t.Fatalf("setup with a slot older than the publication: exit %d, want 0 and the slot made anew\n%s\n%s", code, out, errOut)
	}
	p = startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	like(10)
	c.settlesExact(offPosts, "posts")
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d\n%s", code, p.stderr.String())
	}
}

// TestTeardownRestoreReplicaIdentityFlag: setup --fix-replica-identity sets
// FULL on likes (its primary key lacks post_id); teardown --yes prints the
// statement that gives the DEFAULT identity back, and with
// --restore-replica-identity runs it.
func TestTeardownRestoreReplicaIdentityFlag(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{DefaultIdentity: true}))
	ident := func() string {
		var s string
		if err := c.conn.QueryRow(context.Background(), "SELECT relreplident::text FROM pg_class WHERE oid = 'likes'::regclass").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if code, out := c.run("setup", "--fix-replica-identity"); code != exitOK || ident() != "f" {
		t.Fatalf("setup --fix-replica-identity: exit %d, identity %s\n%s", code, ident(), out)
	}
	code, out := c.run("teardown", "--yes", "--restore-replica-identity")
	if code != exitOK || !strings.Contains(out, `restored replica identity: "public"."likes" REPLICA IDENTITY DEFAULT`) {
		t.Fatalf("teardown --yes --restore-replica-identity: exit %d\n%s", code, out)
	}
	if got := ident(); got != "d" {
		t.Errorf("likes' identity after teardown --restore-replica-identity = %s, want d", got)
	}
}
