package main

import (
	"os"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestComposeExampleChecksClean runs walcount check, with the real binary,
// on a database made by deploy/compose/init.sql, the tables of the
// project's own docker compose example: check finds no problem once setup
// ran and warns about no missing index (it warned that likes(post_id) has
// none before).
func TestComposeExampleChecksClean(t *testing.T) {
	t.Parallel()
	sql, err := os.ReadFile("../../deploy/compose/init.sql")
	if err != nil {
		t.Fatal(err)
	}
	c := newCLI(t, testenv.Database(t), string(sql))
	if code, out := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d\n%s", code, out)
	}
	code, out, _ := walcount(t, nil, "check", "--database-url", c.db, "--redis-url", c.redis, "--slot", c.slot)
	if code != exitOK {
		t.Errorf("check on the compose example: exit %d, want 0", code)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "PROBLEM") || strings.HasPrefix(line, "warning") && strings.Contains(line, "index") {
			t.Errorf("check on the compose example: %s", line)
		}
	}
}
