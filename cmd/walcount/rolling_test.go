package main

import (
	"context"
	"fmt"
	"github.com/walcount/walcount/state"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// lastV4Commit is the last commit whose walcount knew state schema version
// 4: the release an HA pair runs before the upgrade in
// TestRollingUpgradeOfAnHAPair.
const lastV4Commit = "0d9d514"

var (
	oldBinMu  sync.Mutex
	oldBinary = map[string]string{}
)

// olderWalcount builds cmd/walcount as it was at commit, from the
// repository's own history (git archive, then go build), once per commit:
// the binary is kept in the user's cache directory. It skips the test
// when the source has no git history (a release tarball).
func olderWalcount(t *testing.T, commit string) string {
	t.Helper()
	oldBinMu.Lock()
	defer oldBinMu.Unlock()
	if bin, ok := oldBinary[commit]; ok {
		return bin
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("no git history to build the walcount of commit %s from: %v", commit, err)
	}
	if err := exec.Command("git", "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this clone's history (a shallow clone?): %v", commit, err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "walcount-test", "walcount-"+commit)
	if _, err := os.Stat(bin); err == nil {
		oldBinary[commit] = bin
		return bin
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", strings.TrimSpace(string(top)), commit, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	build := exec.Command("go", "build", "-o", tmp, "./cmd/walcount")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the walcount of commit %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	oldBinary[commit] = bin
	return bin
}

// startProgram starts bin as startWalcount starts today's walcount.
func startProgram(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = walcountEnv(env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// TestRollingUpgradeOfAnHAPair upgrades an HA pair the way docs/upgrade.md
// says, under a steady like/unlike load: both halves run the release of
// state schema 4 (built from this repository's history) and share a
// slot; the standby is replaced by today's walcount, which waits for the
// slot and changes nothing while the old active streams; the old active
// is stopped (SIGTERM); today's takes the slot over, and only then
// migrates the schema and streams. The old release started again refuses
// the newer schema before it touches anything. Every count is exact.
func TestRollingUpgradeOfAnHAPair(t *testing.T) {
	t.Parallel()
	old := olderWalcount(t, lastV4Commit)
	ctx := context.Background()
	c := newCLI(t, testenv.Database(t), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 30) g;")
	addrOld, addrNew := unusedAddr(t), unusedAddr(t)
	env := func(addr string) []string {
		return []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
			"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	}
	p := startProgram(t, old, env(""), "setup")
	if code := p.wait(); code != exitOK {
		t.Fatalf("the old release's setup: exit %d", code)
	}
	version := func() int { return c.count(`SELECT max(version) FROM walcount.schema_version`) }
	if v := version(); v != 4 {
		t.Fatalf("the old release made state schema version %d, want 4", v)
	}
	active := startProgram(t, old, env(addrOld), "run")
	waitStreaming(t, active, addrOld)

	// The app likes and unlikes all along, on a connection of its own.
	app, err := pgx.Connect(ctx, c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	lctx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	var loadErr error
	load.Go(func() {
		for i := 0; lctx.Err() == nil; i++ {
			q := `INSERT INTO likes (post_id) SELECT 1 + (g + $1) % 30 FROM generate_series(1, 5) g`
			if i%3 == 2 {
				q = `DELETE FROM likes WHERE id IN (SELECT id FROM likes WHERE post_id = 1 + $1 % 30 LIMIT 2)`
			}
			if _, err := app.Exec(lctx, q, i); err != nil && lctx.Err() == nil {
				loadErr = err
				return
			}
			time.Sleep(10 * time.Millisecond) // a steady trickle, not a flood
		}
	})
	defer stopLoad()

	standby := startWalcount(t, env(addrNew), "run")
	poll(t, "today's walcount to wait for the slot as a standby", func() (bool, string) {
		raw, err := fetchDaemonStatus(ctx, addrNew)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(raw), `"waiting_for_slot": true`), string(raw)
	})
	if !strings.Contains(standby.stderr.String(), "migrates it to version") {
		t.Errorf("the standby does not say it migrates the schema once it has the slot:\n%s", standby.stderr.String())
	}
	if v := version(); v != 4 {
		t.Fatalf("today's standby changed the schema to version %d under the old active", v)
	}

	if code := active.stop(); code != exitOK {
		t.Fatalf("the old active exited %d on SIGTERM", code)
	}
	var stoppedAt time.Time
	if err := c.conn.QueryRow(ctx, `SELECT now()`).Scan(&stoppedAt); err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, standby, addrNew)
	if v := version(); v != state.Version {
		t.Fatalf("state schema version %d once today's walcount streams, want %d", v, state.Version)
	}
	if n := c.count(`SELECT count(*) FROM walcount.schema_version WHERE version = $2 AND applied_at > $1`, stoppedAt, state.Version); n != 1 {
		t.Errorf("the schema was migrated before the old active had stopped")
	}

	// The old release, started again (a supervisor, an operator), refuses.
	again := startProgram(t, old, env(""), "run")
	if code := again.wait(); code == exitOK || !strings.Contains(again.stderr.String(), "newer than this walcount knows (4)") {
		t.Errorf("the old release on the newer schema: exit %d, want a refusal naming the newer schema", code)
	}
	if strings.Contains(again.stderr.String(), `"msg":"streaming"`) {
		t.Errorf("the old release streamed on the newer schema")
	}

	stopLoad()
	load.Wait()
	if loadErr != nil {
		t.Fatalf("the app's load failed: %v", loadErr)
	}
	c.settlesExact(offPosts, "posts")
	if code := standby.stop(); code != exitOK {
		t.Errorf("today's walcount exited %d", code)
	}
	for _, reset := range []string{"discarding it", "resetting it"} {
		if strings.Contains(standby.stderr.String(), reset) {
			t.Errorf("today's walcount logged %q: it did not continue the old one's buffer", reset)
		}
	}
}
