package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// The app's tables as walcount wants them.
var goodSchema = appschema.SQL(appschema.Options{Index: true})

var slotSeq atomic.Int64

// cli runs walcount commands against one database and one Redis.
type cli struct {
	t       *testing.T
	db      string
	redis   string
	slot    string
	conn    *pgx.Conn
	tempDir string
}

func newCLI(t *testing.T, dbURL, schema string) *cli {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if schema != "" {
		if _, err := conn.Exec(ctx, schema); err != nil {
			t.Fatalf("create schema: %v", err)
		}
	}
	return &cli{t: t, db: dbURL, redis: testenv.RedisURL(t), conn: conn, tempDir: t.TempDir(),
		slot: fmt.Sprintf("cli_%d_%d", os.Getpid(), slotSeq.Add(1))}
}

// run executes walcount with args after the connection flags and returns
// its exit code and what it printed on stdout.
func (c *cli) run(args ...string) (int, string) {
	c.t.Helper()
	full := append([]string{args[0], "--database-url", c.db, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", ""}, args[1:]...)
	return execute(c.t, full...)
}

// execute runs the root command as main does and returns the exit code
// and the output, followed by the error main would print.
func execute(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	code := exitCode(err)
	if err != nil {
		fmt.Fprintf(&out, "walcount: %v\n", err)
	}
	t.Logf("walcount %s → exit %d\n%s", strings.Join(args, " "), code, out.String())
	return code, out.String()
}

func (c *cli) writeConfig(yaml string) string {
	c.t.Helper()
	path := filepath.Join(c.tempDir, "walcount.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return path
}

func (c *cli) count(sql string, args ...any) int {
	c.t.Helper()
	var n int
	if err := c.conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestRunRefusesConfigErrors(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema)
	tests := []struct {
		name string
		yaml string
	}{
		{"unknown field", "counters:\n  - name: a\n    source: likes\n    key: post_id\n    target: posts\n    target_key: id\n    column: likes_count\n    colum: x\n"},
		{"missing key", "counters:\n  - name: a\n    source: likes\n    target: posts\n    target_key: id\n    column: likes_count\n"},
		{"duplicate names", "counters:\n  - {name: a, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}\n  - {name: a, source: likes, key: post_id, target: posts, target_key: id, column: other}\n"},
		{"unset variable", "redis_url: ${WALCOUNT_TEST_SURELY_UNSET}\n"},
		{"bad duration", "flush_interval: often\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := c.writeConfig(tc.yaml)
			code, _ := c.run("run", "--config", path)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d", code, exitUsage)
			}
		})
	}
	t.Run("bad flag", func(t *testing.T) {
		if code, _ := c.run("run", "--flush-interval", "0s"); code != exitUsage {
			t.Fatalf("exit %d, want %d", code, exitUsage)
		}
		if code, _ := c.run("run", "--no-such-flag"); code != exitUsage {
			t.Fatalf("exit %d, want %d", code, exitUsage)
		}
	})
	t.Run("config file missing", func(t *testing.T) {
		if code, _ := c.run("run", "--config", filepath.Join(c.tempDir, "nope.yaml")); code != exitUsage {
			t.Fatalf("exit %d, want %d", code, exitUsage)
		}
	})
	// Nothing was started: no slot, no schema.
	if n := c.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", c.slot); n != 0 {
		t.Fatal("a slot was created")
	}
}

func TestRunRefusesDatabaseProblems(t *testing.T) {
	t.Parallel()
	t.Run("surrogate key and default identity", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{DefaultIdentity: true}))
		// Without --fix-replica-identity, setup refuses where run would,
		// names the problem with its fix, and leaves nothing half done.
		code, out := c.run("setup")
		if code != exitFailure || !strings.Contains(out, "replica identity of public.likes is DEFAULT") ||
			!strings.Contains(out, "fix: ALTER TABLE public.likes REPLICA IDENTITY FULL;") {
			t.Fatalf("setup: exit %d, want %d and the identity problem with its fix", code, exitFailure)
		}
		if n := c.count("SELECT count(*) FROM pg_namespace WHERE nspname = 'walcount'") + c.count("SELECT count(*) FROM pg_publication"); n != 0 {
			t.Fatal("a refused setup created its schema or publication")
		}
		code, _ = c.run("run")
		if code != exitFailure {
			t.Fatalf("run: exit %d, want %d", code, exitFailure)
		}
		code, out = c.run("check")
		if code != exitFailure || !strings.Contains(out, "PROBLEM counter post_likes: replica identity of public.likes is DEFAULT") ||
			!strings.Contains(out, "fix: ALTER TABLE public.likes REPLICA IDENTITY FULL;") {
			t.Fatalf("check: exit %d, want 1 and the identity problem with its fix", code)
		}
	})
	t.Run("an unlogged partition of the source", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{PartitionBy: "RANGE (post_id)", DefaultIdentity: true, Index: true})+`
CREATE TABLE likes_a PARTITION OF likes FOR VALUES FROM (0) TO (100);
CREATE UNLOGGED TABLE likes_b PARTITION OF likes FOR VALUES FROM (100) TO (200);
ALTER TABLE likes_a REPLICA IDENTITY FULL;
ALTER TABLE likes_b REPLICA IDENTITY FULL;`)
		// Its rows are never in the WAL: setup, run and check refuse
		// with the configuration's exit status and the fix.
		const says = "source public.likes has UNLOGGED partitions (public.likes_b)"
		const fix = "fix: ALTER TABLE public.likes_b SET LOGGED;"
		for _, cmd := range []string{"setup", "run", "check"} {
			code, out := c.run(cmd)
			if code != exitUsage || !strings.Contains(out, says) || !strings.Contains(out, fix) {
				t.Fatalf("%s: exit %d, want %d and the unlogged partition with its fix; output:\n%s", cmd, code, exitUsage, out)
			}
			if n := c.count("SELECT count(*) FROM pg_namespace WHERE nspname = 'walcount'") + c.count("SELECT count(*) FROM pg_publication"); n != 0 {
				t.Fatalf("a refused %s created walcount's schema or publication", cmd)
			}
		}
	})
	t.Run("not set up", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t, testenv.Database(t), goodSchema)
		if code, _ := c.run("run"); code != exitFailure {
			t.Fatalf("run: exit %d, want %d", code, exitFailure)
		}
	})
	t.Run("config names a column that does not exist", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t, testenv.Database(t), goodSchema)
		path := c.writeConfig("counters:\n  - {name: a, source: likes, key: post_idd, target: posts, target_key: id, column: likes_count}\n")
		code, out := c.run("check", "--config", path)
		if code != exitUsage || !strings.Contains(out, "column public.likes.post_idd does not exist") {
			t.Fatalf("check: exit %d, want %d (as run) naming post_idd", code, exitUsage)
		}
		// The config file is what is wrong: a configuration error.
		code, out = c.run("run", "--config", path)
		if code != exitUsage || !strings.Contains(out, "post_idd") || !strings.Contains(out, "set counters[0].key") {
			t.Fatalf("run: exit %d, want %d naming the field; output:\n%s", code, exitUsage, out)
		}
	})
	t.Run("wal_level replica", func(t *testing.T) {
		t.Parallel()
		pg := testenv.Postgres(t, servers.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}})
		c := newCLI(t, pg.URL(), goodSchema)
		code, out := c.run("setup")
		if code != exitFailure || !strings.Contains(out, "wal_level is \"replica\"; run ALTER SYSTEM SET wal_level = logical;") {
			t.Fatalf("setup: exit %d, want %d and the fix", code, exitFailure)
		}
		if code, _ := c.run("run"); code != exitFailure {
			t.Fatalf("run: exit %d, want %d", code, exitFailure)
		}
		code, out = c.run("check")
		if code != exitFailure || !strings.Contains(out, "PROBLEM wal_level is replica") {
			t.Fatalf("check: exit %d, want 1 and the wal_level problem", code)
		}
	})
}

func TestCheckExitCodes(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema+"\nALTER TABLE likes ADD COLUMN deleted_at timestamptz, ADD COLUMN weight numeric(12,2);\n"+
		"ALTER TABLE posts ADD COLUMN live_count bigint NOT NULL DEFAULT 0, ADD COLUMN weight numeric(14,2) NOT NULL DEFAULT 0;")
	path := c.writeConfig(`
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_live_likes, source: likes, key: post_id, target: posts, target_key: id, column: live_count, where: {deleted_at: null}}
  - {name: post_weight, source: likes, key: post_id, target: posts, target_key: id, column: weight, sum: weight}
`)
	// Before setup: the slot, the publication and the checkpoint are
	// missing.
	code, out := c.run("check", "--config", path)
	if code != exitFailure {
		t.Fatalf("check before setup: exit %d, want %d", code, exitFailure)
	}
	for _, want := range []string{"publication walcount does not exist", "replication slot " + c.slot + " does not exist"} {
		if !strings.Contains(out, want) {
			t.Errorf("check before setup does not say %q", want)
		}
	}

	if code, _ := c.run("setup", "--config", path); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	code, out = c.run("check", "--config", path)
	if code != exitOK {
		t.Fatalf("check after setup: exit %d, want 0", code)
	}
	if strings.Contains(out, "PROBLEM") {
		t.Fatal("check exits 0 with a PROBLEM line")
	}
	// max_slot_wal_keep_size = -1 is advice, not a failure.
	if !strings.Contains(out, "warning max_slot_wal_keep_size") {
		t.Error("no warning about max_slot_wal_keep_size = -1")
	}

	// A problem: an unconstrained numeric sum.
	if _, err := c.conn.Exec(context.Background(), "ALTER TABLE likes ALTER COLUMN weight TYPE numeric"); err != nil {
		t.Fatal(err)
	}
	code, out = c.run("check", "--config", path)
	if code != exitFailure || !strings.Contains(out, "fix: ALTER TABLE public.likes ALTER COLUMN weight TYPE numeric(12,2);") {
		t.Fatalf("check with an unconstrained numeric sum: exit %d, want 1 and the fix", code)
	}
	if code, _ := c.run("run", "--config", path); code != exitFailure {
		t.Fatalf("run with an unconstrained numeric sum: exit %d, want %d", code, exitFailure)
	}
}

func TestTeardownNeedsYes(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema)
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	present := func() int {
		return c.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", c.slot) +
			c.count("SELECT count(*) FROM pg_publication WHERE pubname = 'walcount'") +
			c.count("SELECT count(*) FROM pg_namespace WHERE nspname = 'walcount'")
	}
	code, out := c.run("teardown")
	if code != exitOK || !strings.Contains(out, "would drop") || !strings.Contains(out, "--yes") || !strings.Contains(out, c.slot) {
		t.Fatalf("teardown without --yes: exit %d", code)
	}
	if n := present(); n != 3 {
		t.Fatalf("teardown without --yes dropped something: %d of 3 left", n)
	}
	if code, _ := c.run("teardown", "--yes"); code != exitOK {
		t.Fatalf("teardown --yes: exit %d", code)
	}
	if n := present(); n != 0 {
		t.Fatalf("%d of slot, publication and schema left after teardown --yes", n)
	}
}
