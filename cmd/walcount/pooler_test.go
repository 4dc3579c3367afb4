package main

import (
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestCheckAndSetupRefuseStatementPool runs walcount check and walcount
// setup with database_url at a PgBouncer pool in statement mode and
// replication_url direct, as an operator would misconfigure them: check used
// to exit 0 (while run could never flush) and setup failed with PgBouncer's
// raw FATAL. Both now exit 2, a problem of the configuration, with the fix.
func TestCheckAndSetupRefuseStatementPool(t *testing.T) {
	t.Parallel()
	direct := testenv.Database(t)
	c := newCLI(t, direct, goodSchema)
	pooled := testenv.PgBouncer(t, direct, servers.PgBouncerOptions{PoolMode: "statement"})

	for _, command := range []string{"check", "setup"} {
		code, out := execute(t, command, "--database-url", pooled, "--replication-url", direct, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", "")
		if code != exitUsage {
			t.Errorf("%s through a statement pool: exit %d, want %d", command, code, exitUsage)
		}
		if !strings.Contains(out, "statement mode") || !strings.Contains(out, "pool_mode = transaction") {
			t.Errorf("%s through a statement pool does not name it with the fix:\n%s", command, out)
		}
	}
	if n := c.count("SELECT count(*)::int FROM pg_replication_slots WHERE slot_name = $1", c.slot); n != 0 {
		t.Errorf("the refused setup created the slot")
	}
}
