package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// walcountBinary builds cmd/walcount once per test binary and returns its
// path, for tests that must see what a user sees: exit codes, stdout and
// the logs on stderr.
func walcountBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "walcount-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "walcount")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binErr = err
			binPath = string(out)
		}
	})
	if binErr != nil {
		t.Fatalf("build walcount: %v\n%s", binErr, binPath)
	}
	return binPath
}

// problemLines returns the messages of check's PROBLEM lines and of run's
// refusal, each with its fix, sorted: the two commands print the same
// findings in two layouts.
func problemLines(out string) []string {
	var ps []string
	for line := range strings.SplitSeq(out, "\n") {
		if m, ok := strings.CutPrefix(line, "PROBLEM "); ok {
			ps = append(ps, strings.TrimSpace(m))
		} else if m, ok := strings.CutPrefix(line, "  - "); ok {
			ps = append(ps, strings.TrimSpace(m))
		}
	}
	slices.Sort(ps)
	return ps
}

// TestCheckAndRunAgree runs the real binary's check and run on databases in
// several states: run starts exactly when check passes, both exit with the
// same code otherwise, and they name the same problems.
func TestCheckAndRunAgree(t *testing.T) {
	t.Parallel()
	bin := walcountBinary(t)
	tests := []struct {
		name   string
		schema string
		setup  bool
		config string
		// problems, when not 0, is how many problems check must name:
		// one mistake in the configuration is one problem, not also the
		// findings that follow from it.
		problems int
	}{
		{name: "ready", schema: goodSchema, setup: true},
		{name: "not set up", schema: goodSchema},
		{name: "default replica identity", schema: appschema.SQL(appschema.Options{DefaultIdentity: true})},
		{name: "config names a missing column", schema: goodSchema, setup: true,
			config:   "counters:\n  - {name: a, source: likes, key: post_idd, target: posts, target_key: id, column: likes_count}\n",
			problems: 1},
		{name: "sum of a generated column walcount derives", schema: goodSchema + `
ALTER TABLE likes ADD COLUMN up int, ADD COLUMN down int, ADD COLUMN score int GENERATED ALWAYS AS (up - down) STORED;`, setup: true,
			config: "counters:\n  - {name: a, source: likes, key: post_id, target: posts, target_key: id, column: likes_count, sum: score}\n"},
		{name: "sum of a generated column walcount cannot derive", schema: goodSchema + `
ALTER TABLE likes ADD COLUMN up int, ADD COLUMN half int GENERATED ALWAYS AS (up / 2) STORED;`,
			config: "counters:\n  - {name: a, source: likes, key: post_id, target: posts, target_key: id, column: likes_count, sum: half}\n"},
		{name: "missing counter column", schema: appschema.SQL(appschema.Options{}) + "ALTER TABLE posts DROP COLUMN likes_count;"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCLI(t, testenv.Database(t), tt.schema)
			var extra []string
			if tt.config != "" {
				extra = []string{"--config", c.writeConfig(tt.config)}
			}
			if tt.setup {
				if code, out := c.run("setup"); code != exitOK {
					t.Fatalf("setup: exit %d\n%s", code, out)
				}
			}
			checkCode, checkOut := c.runBinary(bin, 0, append([]string{"check"}, extra...)...)
			runCode, runOut := c.runBinary(bin, 20*time.Second, append([]string{"run"}, extra...)...)
			if checkCode == exitOK {
				// run must have started and then stopped cleanly on SIGTERM.
				if runCode != exitOK || !strings.Contains(runOut, "streaming") {
					t.Fatalf("check passed but run did not start (exit %d):\n%s", runCode, runOut)
				}
				return
			}
			if runCode != checkCode {
				t.Fatalf("check exits %d but run exits %d\ncheck:\n%s\nrun:\n%s", checkCode, runCode, checkOut, runOut)
			}
			cp, rp := problemLines(checkOut), problemLines(runOut)
			if len(cp) == 0 || !slices.Equal(cp, rp) {
				t.Fatalf("check and run name different problems\ncheck: %q\nrun:   %q", cp, rp)
			}
			if tt.problems != 0 && len(cp) != tt.problems {
				t.Fatalf("check names %d problems, want %d:\n%s", len(cp), tt.problems, checkOut)
			}
		})
	}
}

// runBinary runs the real walcount binary with the connection flags. A run
// that is still going after stopAfter (it started streaming) gets SIGTERM.
// It returns the exit code and stdout and stderr together.
func (c *cli) runBinary(bin string, stopAfter time.Duration, args ...string) (int, string) {
	c.t.Helper()
	full := append([]string{args[0], "--database-url", c.db, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", ""}, args[1:]...)
	cmd := exec.Command(bin, full...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if stopAfter > 0 {
		// A daemon that got past its preflight logs "streaming"; stop it
		// then, or after stopAfter if it never does.
		deadline := time.Now().Add(stopAfter)
	wait:
		for {
			select {
			case <-done:
				break wait
			case <-time.After(50 * time.Millisecond):
			}
			if strings.Contains(out.String(), `"streaming"`) || time.Now().After(deadline) {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				break
			}
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
	}
	code := cmd.ProcessState.ExitCode()
	c.t.Logf("walcount %s → exit %d\n%s", strings.Join(full, " "), code, out.String())
	return code, out.String()
}

// lockedBuffer is a bytes.Buffer that a running process writes into while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
