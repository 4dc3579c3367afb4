package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// TestFreshReadExample runs the Go client example of docs/fresh-reads.md
// (examples/freshread) against a daemon on the compose example's tables,
// with a flush interval long enough that no flush runs: each like it makes
// is still pending in Redis when it reads, and the count it prints must be
// COUNT(*) of the post's likes, its own like included.
func TestFreshReadExample(t *testing.T) {
	t.Parallel()
	sql, err := os.ReadFile("../../deploy/compose/init.sql")
	if err != nil {
		t.Fatal(err)
	}
	c := newCLI(t, testenv.Database(t), string(sql)+`
INSERT INTO likes (post_id) SELECT 42 FROM generate_series(1, 5);`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=1h"}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	d := startWalcount(t, env, "run")
	waitStreaming(t, d, addr)
	// The backfill of the new counter writes the 5 likes made before setup
	// to the column; fresh reads answer the column as it is meanwhile.
	wait.For(t, 2*time.Minute, "the backfill done", func() bool {
		return c.count(`SELECT count(*) FROM walcount.reconcile_runs WHERE slot_name = $1 AND kind = 'backfill' AND status = 'done'`, c.slot) == 1
	})

	bin := filepath.Join(t.TempDir(), "freshread")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/freshread").CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	printed := regexp.MustCompile(`^post 42 has (\d+) likes \(exact at \S+, written at \S+\)\n$`)
	for i := range 3 {
		cmd := exec.Command(bin, "-post", "42")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+c.db, "WALCOUNT_URL=http://"+addr)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("run %d of the example: %v\n%s", i+1, err, out)
		}
		t.Logf("the example printed: %s", out)
		m := printed.FindSubmatch(out)
		if m == nil {
			t.Fatalf("run %d of the example printed %q", i+1, out)
		}
		got, _ := strconv.Atoi(string(m[1]))
		if want := c.count("SELECT count(*) FROM likes WHERE post_id = 42"); got != want {
			t.Errorf("run %d of the example printed %d likes, COUNT(*) is %d", i+1, got, want)
		}
	}
	if col := c.count("SELECT likes_count FROM posts WHERE id = 42"); col > 5 {
		t.Errorf("likes_count is %d: a flush ran, so the example's reads did not have to add pending likes", col)
	}
	if code := d.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
