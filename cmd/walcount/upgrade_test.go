package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/state"
)

// upgradeCLI is a deployment whose state is rewritten to an older schema
// version, as an older walcount left it.
type upgradeCLI struct {
	*cli
	addr string
}

func newUpgradeCLI(t *testing.T) *upgradeCLI {
	t.Helper()
	c := newCLI(t, testenv.Database(t), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;")
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	return &upgradeCLI{cli: c, addr: unusedAddr(t)}
}

// env is the environment of this deployment's walcount run.
func (c *upgradeCLI) env(flushInterval string, extra ...string) []string {
	return append([]string{
		"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + c.addr, "WALCOUNT_FLUSH_INTERVAL=" + flushInterval,
	}, extra...)
}

func (c *upgradeCLI) exec(sql string, args ...any) {
	c.t.Helper()
	if _, err := c.conn.Exec(context.Background(), sql, args...); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
}

// like inserts n likes over the 20 posts.
func (c *upgradeCLI) like(n int) {
	c.t.Helper()
	c.exec(`INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, $1) g`, n)
}

// offPosts is the query of the posts whose count is not the truth.
const offPosts = `SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)`

// bufferedSum is the sum of the deltas of counter post_likes in the
// slot's Redis buffer.
func (c *upgradeCLI) bufferedSum() (int64, error) {
	opt, err := redis.ParseURL(c.redis)
	if err != nil {
		return 0, err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	fields, err := rdb.HGetAll(context.Background(), "walcount:{"+c.slot+"}:buffer").Result()
	if err != nil {
		return 0, err
	}
	var sum int64
	for f, v := range fields {
		if strings.HasPrefix(f, buffer.StampField) {
			continue // the chain's stamp and lifecycle moves
		}
		if !strings.HasPrefix(f, "post_likes:") {
			return 0, fmt.Errorf("unexpected field %q in the buffer", f)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("field %s: %w", f, err)
		}
		sum += n
	}
	return sum, nil
}

// firstRun counts likes with today's walcount until every post is exact
// and the counter's backfill is recorded, then stops it: the deployment as
// any release left it running.
func (c *upgradeCLI) firstRun(likes int) {
	c.t.Helper()
	c.like(likes)
	p := startWalcount(c.t, c.env("100ms"), "run")
	waitStreaming(c.t, p, c.addr)
	c.settlesExact(offPosts, "posts")
	poll(c.t, "the counter's backfill to be recorded", func() (bool, string) {
		n := c.count(`SELECT count(*) FROM walcount.counters WHERE slot_name = $1 AND backfilled_at IS NOT NULL`, c.slot)
		return n == 1, fmt.Sprintf("%d counters backfilled", n)
	})
	if code := p.stop(); code != exitOK {
		c.t.Fatalf("the first walcount exited %d", code)
	}
}

// leaveBufferedDeltas runs a walcount that never flushes, makes likes and
// unlikes, waits until its Redis buffer holds them (want, summed) and
// kills it with SIGKILL: deltas past W are in Redis and nowhere else but
// the WAL.
func (c *upgradeCLI) leaveBufferedDeltas(likes, unlikes int) {
	c.t.Helper()
	p := startWalcount(c.t, c.env("1h"), "run")
	waitStreaming(c.t, p, c.addr)
	c.like(likes)
	c.exec(`DELETE FROM likes WHERE id IN (SELECT id FROM likes ORDER BY id DESC LIMIT $1)`, unlikes)
	want := int64(likes - unlikes)
	poll(c.t, "the deltas to be buffered in Redis", func() (bool, string) {
		got, err := c.bufferedSum()
		if err != nil {
			return false, err.Error()
		}
		return got == want, fmt.Sprintf("buffered %d of %d; column sum %d", got, want, c.count(`SELECT sum(likes_count) FROM posts`))
	})
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	<-p.done
}

// stateRows is what an older walcount kept of this deployment.
type stateRows struct {
	w                   string
	definition          string
	backfilled          *time.Time
	ownerTable, ownerCo string
}

// downgradeState rewrites walcount's state to schema version v from its
// testdata (state/testdata/schema_vN.sql), keeping what that version
// held: W, the counter's backfilled definition, the column's claim (v2
// on), walcount.messages in the publication (v3 on, as setup published
// it). It returns W.
func (c *upgradeCLI) downgradeState(v int) string {
	c.t.Helper()
	ctx := context.Background()
	var r stateRows
	if err := c.conn.QueryRow(ctx, `SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1`, c.slot).Scan(&r.w); err != nil {
		c.t.Fatal(err)
	}
	if err := c.conn.QueryRow(ctx, `SELECT definition, backfilled_at FROM walcount.counters WHERE slot_name = $1 AND name = 'post_likes'`, c.slot).Scan(&r.definition, &r.backfilled); err != nil {
		c.t.Fatalf("the counter's backfill record: %v", err)
	}
	if err := c.conn.QueryRow(ctx, `SELECT target_table, target_column FROM walcount.owners WHERE slot_name = $1`, c.slot).Scan(&r.ownerTable, &r.ownerCo); err != nil {
		c.t.Fatal(err)
	}
	ddl, err := os.ReadFile(filepath.Join("..", "..", "state", "testdata", fmt.Sprintf("schema_v%d.sql", v)))
	if err != nil {
		c.t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, c.conn, func(tx pgx.Tx) error {
		stmts := []string{`DROP SCHEMA walcount CASCADE`, string(ddl)}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%.60s: %w", s, err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at) VALUES ($1, $2, now())`, c.slot, r.w); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO walcount.counters (slot_name, name, definition, backfilled_at) VALUES ($1, 'post_likes', $2, $3)`, c.slot, r.definition, r.backfilled); err != nil {
			return err
		}
		if v >= 2 {
			if _, err := tx.Exec(ctx, `UPDATE walcount.checkpoint SET publication = 'walcount' WHERE slot_name = $1`, c.slot); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO walcount.owners (target_table, target_column, slot_name, counter) VALUES ($1, $2, $3, 'post_likes')`, r.ownerTable, r.ownerCo, c.slot); err != nil {
				return err
			}
		}
		if v >= 3 {
			if _, err := tx.Exec(ctx, `ALTER PUBLICATION walcount ADD TABLE walcount.messages`); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("rewrite the state to version %d: %v", v, err)
	}
	return r.w
}

// TestUpgradeFromEveryStateSchema upgrades a deployment from every state
// schema a walcount shipped (state/testdata) the way a package upgrade
// does: the old walcount was killed with deltas buffered in Redis (and,
// from version 4 on, a delta carried in walcount.carried, its row still
// short of it), changes went on while nothing ran, and today's walcount
// run starts on the same database and Redis. It migrates the schema by
// itself, keeps W, the buffer and the carried delta, and every count is
// exact, with no reconciliation to hide a lost delta. Before, run refused
// with exit 1 until someone ran walcount setup.
func TestUpgradeFromEveryStateSchema(t *testing.T) {
	t.Parallel()
	for v := 0; v < state.Version; v++ {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			t.Parallel()
			c := newUpgradeCLI(t)
			c.firstRun(60)
			c.leaveBufferedDeltas(40, 5)
			w := c.downgradeState(v)
			if v >= 4 {
				// A flush that could not lock post 5's row carried 3 of
				// its likes: the column is 3 short, the carried row
				// holds them.
				c.exec(`UPDATE posts SET likes_count = likes_count - 3 WHERE id = 5`)
				c.exec(`INSERT INTO walcount.carried (slot_name, counter, key, delta) VALUES ($1, 'post_likes', '5', 3)`, c.slot)
			}
			c.like(30) // while no walcount runs
			if code, out := c.run("check"); code != exitOK || !strings.Contains(out, fmt.Sprintf("walcount run migrates it to version %d", state.Version)) {
				t.Errorf("check on state schema version %d: exit %d, want 0 and a warning that run migrates it", v, code)
			}

			p := startWalcount(t, c.env("100ms"), "run")
			waitStreaming(t, p, c.addr)
			c.like(10) // and after
			c.settlesExact(offPosts, "posts")
			if code := p.stop(); code != exitOK {
				t.Fatalf("today's walcount exited %d", code)
			}
			logs := p.stderr.String()
			if !strings.Contains(logs, "migrated walcount's state schema") || !strings.Contains(logs, fmt.Sprintf(`"from_version":%d`, v)) {
				t.Errorf("the log does not say the schema was migrated from version %d", v)
			}
			for _, reset := range []string{"discarding it", "resetting it", "session failed"} {
				if strings.Contains(logs, reset) {
					t.Errorf("today's walcount logged %q: the old buffer was not kept", reset)
				}
			}
			if n := c.count(`SELECT count(*) FROM walcount.reconcile_runs`); n != 0 {
				t.Errorf("%d reconciliation runs: the counts must be exact from the checkpoint, the buffer and the carried rows alone", n)
			}
			if n := c.count(`SELECT max(version) FROM walcount.schema_version`); n != state.Version {
				t.Errorf("state schema version %d after the upgrade, want %d", n, state.Version)
			}
			if n := c.count(`SELECT count(*) FROM walcount.checkpoint WHERE slot_name = $1 AND lsn > $2::pg_lsn`, c.slot, w); n != 1 {
				t.Errorf("W did not move on from the old walcount's %s", w)
			}
			if n := c.count(`SELECT count(*) FROM pg_publication_tables WHERE pubname = 'walcount' AND schemaname = 'walcount' AND tablename = 'messages'`); n != 1 {
				t.Errorf("walcount.messages is not in the publication after the upgrade")
			}
			if n := c.count(`SELECT count(*) FROM walcount.carried`); n != 0 {
				t.Errorf("%d carried rows left", n)
			}
		})
	}
}

// TestUpgradeNeedsTheStateOwner: the state schema (version 2) belongs to
// another role than walcount's, which has only the grants it runs with (a
// real CREATE ROLE). walcount run, with and without its preflight, stops
// with exit 2, which a supervisor does not restart, naming the owner and
// the exact statements, and changes nothing. The owner runs those
// statements as printed; then walcount starts and every count is exact.
func TestUpgradeNeedsTheStateOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newUpgradeCLI(t)
	c.firstRun(50)
	c.downgradeState(2)
	c.like(20)

	role := fmt.Sprintf("upg_walcount_%d_%d", os.Getpid(), slotSeq.Add(1))
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN REPLICATION",
		"GRANT USAGE ON SCHEMA walcount TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO " + role,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO " + role,
		"GRANT SELECT ON likes TO " + role, "GRANT SELECT, UPDATE (likes_count) ON posts TO " + role,
	} {
		c.exec(sql)
	}
	t.Cleanup(func() {
		_, _ = c.conn.Exec(context.Background(), "DROP OWNED BY "+role+" CASCADE")
		_, _ = c.conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	asRole := strings.Replace(c.db, "postgres@", role+"@", 1)
	env := c.env("100ms", "WALCOUNT_DATABASE_URL="+asRole)

	code, _, stderr := walcount(t, env, "run")
	if code != exitUsage || !strings.Contains(stderr, "may not migrate it") || !strings.Contains(stderr, "as role postgres") ||
		!strings.Contains(stderr, "CREATE TABLE walcount.messages") || !strings.Contains(stderr, `ALTER PUBLICATION "walcount" ADD TABLE walcount.messages`) {
		t.Errorf("run as a role that may not migrate: exit %d, want %d naming the owner and the statements", code, exitUsage)
	}
	code, _, stderr = walcount(t, env, "run", "--skip-check")
	const intro = "then start walcount again:\n"
	i := strings.Index(stderr, intro)
	if code != exitUsage || i < 0 || !strings.Contains(stderr, "Have role postgres (the owner of schema walcount)") {
		t.Fatalf("run --skip-check as a role that may not migrate: exit %d, want %d with the owner's statements", code, exitUsage)
	}
	if n := c.count(`SELECT max(version) FROM walcount.schema_version`); n != 2 {
		t.Fatalf("the refused migration changed the schema to version %d", n)
	}

	// The owner runs the statements exactly as printed.
	script := strings.TrimSpace(stderr[i+len(intro):])
	if err := pgx.BeginFunc(ctx, c.conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, script)
		return err
	}); err != nil {
		t.Fatalf("the owner runs the printed statements: %v\n%s", err, script)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, c.addr)
	c.like(10)
	c.settlesExact(offPosts, "posts")
	if code := p.stop(); code != exitOK {
		t.Errorf("walcount after the owner's statements exited %d", code)
	}
	if strings.Contains(p.stderr.String(), "migrated walcount's state schema") {
		t.Errorf("walcount migrated again what the owner had migrated")
	}
}

// TestUpgradeWithTheOwnersPublication: walcount's role owns its state
// (version 2) but not the publication, as the owner-prepared setup of
// docs/operations.md leaves them. walcount run migrates its state, keeps
// it, and stops with exit 2 and the one statement the publication's owner
// must run: walcount.messages added to the publication. Once the owner ran
// it, walcount starts and every count is exact.
func TestUpgradeWithTheOwnersPublication(t *testing.T) {
	t.Parallel()
	c := newUpgradeCLI(t)
	c.firstRun(40)
	c.downgradeState(2)
	c.like(15)

	role := fmt.Sprintf("upg_own_%d_%d", os.Getpid(), slotSeq.Add(1))
	c.exec("CREATE ROLE " + role + " LOGIN REPLICATION")
	t.Cleanup(func() {
		_, _ = c.conn.Exec(context.Background(), "DROP OWNED BY "+role+" CASCADE")
		_, _ = c.conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	// The state is the role's own; the app's tables and the publication
	// stay postgres's.
	c.exec(`DO $$DECLARE r record; BEGIN
  EXECUTE format('ALTER SCHEMA walcount OWNER TO %I', '` + role + `');
  FOR r IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'walcount' AND c.relkind = 'r' LOOP
    EXECUTE format('ALTER TABLE walcount.%I OWNER TO %I', r.relname, '` + role + `');
  END LOOP; END$$`)
	c.exec("GRANT SELECT ON likes TO " + role + "; GRANT SELECT, UPDATE (likes_count) ON posts TO " + role)
	env := c.env("100ms", "WALCOUNT_DATABASE_URL="+strings.Replace(c.db, "postgres@", role+"@", 1))

	code, _, stderr := walcount(t, env, "run")
	const intro = "then start walcount again:\n"
	i := strings.Index(stderr, intro)
	if code != exitUsage || i < 0 || !strings.Contains(stderr, "have role postgres (the owner of the publication") {
		t.Fatalf("run as the state's owner without the publication: exit %d, want %d with the publication owner's statement", code, exitUsage)
	}
	if n := c.count(`SELECT max(version) FROM walcount.schema_version`); n != state.Version {
		t.Errorf("the state schema is at version %d, want it migrated to %d by walcount's own role", n, state.Version)
	}
	stmt := strings.TrimSpace(stderr[i+len(intro):])
	if stmt != `ALTER PUBLICATION "walcount" ADD TABLE walcount.messages;` {
		t.Errorf("the owner's statement is %q", stmt)
	}
	c.exec(stmt)

	p := startWalcount(t, env, "run")
	waitStreaming(t, p, c.addr)
	c.like(10)
	c.settlesExact(offPosts, "posts")
	if code := p.stop(); code != exitOK {
		t.Errorf("walcount after the owner's statement exited %d", code)
	}
}

// TestUpgradeWithTheSlotLost: the slot of a deployment on state schema 1
// (before dirty marks existed) is gone when today's walcount starts with
// on_slot_loss: recreate. It migrates the state first (no walcount can
// stream a lost slot), recreates the slot, marks the counter dirty and
// repairs it: every count exact.
func TestUpgradeWithTheSlotLost(t *testing.T) {
	t.Parallel()
	c := newUpgradeCLI(t)
	c.firstRun(30)
	c.downgradeState(1)
	c.exec(`SELECT pg_drop_replication_slot($1)`, c.slot)
	c.like(25) // unseen by any slot

	p := startWalcount(t, c.env("100ms", "WALCOUNT_ON_SLOT_LOSS=recreate"), "run")
	c.settlesExact(offPosts, "posts")
	if code := p.stop(); code != exitOK {
		t.Errorf("today's walcount exited %d", code)
	}
	if !strings.Contains(p.stderr.String(), "migrated walcount's state schema") {
		t.Errorf("the log does not say the schema was migrated")
	}
	if n := c.count(`SELECT count(*) FROM walcount.dirty`); n != 0 {
		t.Errorf("%d dirty marks left after the repair", n)
	}
}
