package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/state"
)

// TestExitCodeClasses runs the real binary for each class of README's
// table of exit codes against real servers: what only a person can fix
// exits 2, which deploy/systemd's RestartPreventExitStatus=2 never
// restarts (a bad configuration, a Redis user that does not exist, a role
// without its privileges, the state schema of a newer walcount, with and
// without run's preflight); a server that is down is transient, exit 1
// (check), or waited for (run). The wrong PostgreSQL password is
// TestConnectionErrors's.
func TestExitCodeClasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCLI(t, testenv.Database(t), goodSchema)
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	base := []string{"--database-url", c.db, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", ""}
	expect := func(t *testing.T, name string, env []string, args []string, want int, says ...string) {
		t.Helper()
		code, stdout, stderr := walcount(t, env, args...)
		if code != want {
			t.Errorf("%s: walcount %s exited %d, want %d", name, args[0], code, want)
		}
		for _, s := range says {
			if !strings.Contains(stdout+stderr, s) {
				t.Errorf("%s: walcount %s does not say %q", name, args[0], s)
			}
		}
	}

	t.Run("configuration", func(t *testing.T) {
		t.Parallel()
		path := c.writeConfig("counters:\n  - {name: c, source: no_such_table, key: post_id, target: posts, target_key: id, column: likes_count}\n")
		for _, cmd := range []string{"check", "run"} {
			expect(t, "a counter on a table that does not exist", nil, append([]string{cmd, "--config", path}, base[:6]...), exitUsage, "no_such_table")
		}
	})
	t.Run("authentication", func(t *testing.T) {
		t.Parallel()
		redisURL := strings.Replace(c.redis, "redis://", "redis://no_such_user:wrong@", 1)
		for _, cmd := range []string{"check", "run"} {
			expect(t, "a Redis user that does not exist", nil, []string{cmd, "--database-url", c.db, "--redis-url", redisURL, "--slot", c.slot, "--http-addr", ""}, exitUsage, "WRONGPASS")
		}
	})
	t.Run("privilege", func(t *testing.T) {
		t.Parallel()
		role := fmt.Sprintf("cls_walcount_%d_%d", os.Getpid(), slotSeq.Add(1))
		if _, err := c.conn.Exec(ctx, "CREATE ROLE "+role+" LOGIN REPLICATION"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
		asRole := strings.Replace(c.db, "postgres@", role+"@", 1)
		for _, cmd := range []string{"check", "run"} {
			expect(t, "a role without its grants", nil, []string{cmd, "--database-url", asRole, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", ""}, exitUsage,
				"role "+role+" lacks", "GRANT SELECT")
		}
	})
	t.Run("newer state", func(t *testing.T) {
		// Not parallel with the others: the schema is theirs too.
		newer := c.newerState(t)
		for _, args := range [][]string{append([]string{"check"}, base...), append([]string{"run"}, base...), append([]string{"run", "--skip-check"}, base...)} {
			expect(t, "the state of a newer walcount", nil, args, exitUsage, newer)
		}
	})
	t.Run("transient", func(t *testing.T) {
		t.Parallel()
		down := "postgres://postgres@" + unusedAddr(t) + "/app?connect_timeout=5"
		for _, cmd := range []string{"check", "status"} {
			expect(t, "PostgreSQL down", nil, []string{cmd, "--database-url", down, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", ""}, exitFailure, "cannot connect to PostgreSQL")
		}
	})
}

// newerState records a state schema version one above this walcount's,
// as a newer walcount would, until the test ends; it returns what the
// refusal says.
func (c *cli) newerState(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	if _, err := c.conn.Exec(ctx, `INSERT INTO walcount.schema_version (version) VALUES ($1)`, state.Version+1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.conn.Exec(context.Background(), `DELETE FROM walcount.schema_version WHERE version > $1`, state.Version)
	})
	return fmt.Sprintf("version %d, newer than this walcount knows (%d)", state.Version+1, state.Version)
}
