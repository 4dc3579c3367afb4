package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestExitCodesWithoutServers runs the real binary where no server is
// needed to decide: usage and configuration errors exit 2, runtime
// problems 1, and --version works like version.
func TestExitCodesWithoutServers(t *testing.T) {
	t.Parallel()
	closed := unusedAddr(t) // nothing listens there
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		says []string // on stdout or stderr
	}{
		{name: "version", args: []string{"version"}, code: exitOK, says: []string{"walcount "}},
		{name: "--version", args: []string{"--version"}, code: exitOK, says: []string{"walcount "}},
		{name: "no command prints help", args: nil, code: exitOK, says: []string{"Available Commands"}},
		{name: "unknown command", args: []string{"frobnicate"}, code: exitUsage, says: []string{`unknown command "frobnicate"`}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, code: exitUsage, says: []string{"unknown flag: --no-such-flag"}},
		{name: "unknown flag of a command", args: []string{"status", "--bogus"}, code: exitUsage, says: []string{"unknown flag: --bogus"}},
		{name: "stray argument", args: []string{"status", "extra"}, code: exitUsage, says: []string{"takes no arguments"}},
		{name: "bad duration in the environment", env: []string{"WALCOUNT_FLUSH_INTERVAL=often"}, args: []string{"check"},
			code: exitUsage, says: []string{`WALCOUNT_FLUSH_INTERVAL: "often" is not a duration`}},
		{name: "bad log format in the environment", env: []string{"WALCOUNT_LOG_FORMAT=xml"}, args: []string{"run"},
			code: exitUsage, says: []string{`WALCOUNT_LOG_FORMAT: "xml" is not one of auto, console, json`}},
		{name: "bad log format flag", args: []string{"run", "--log-format", "xml"},
			code: exitUsage, says: []string{`--log-format: "xml" is not one of auto, console, json`}},
		{name: "reconcile with HTTP off", args: []string{"reconcile", "--http-addr", ""},
			code: exitUsage, says: []string{"set --http-addr or WALCOUNT_HTTP_ADDR"}},
		{name: "reconcile with no daemon", env: []string{"WALCOUNT_HTTP_ADDR=" + closed}, args: []string{"reconcile", "--dry-run"},
			code: exitFailure, says: []string{"no walcount daemon answers at " + closed, "--http-addr or WALCOUNT_HTTP_ADDR"}},
		{name: "status with no database", args: []string{"status", "--database-url", "postgres://postgres@" + closed + "/app?connect_timeout=5"},
			code: exitFailure, says: []string{"cannot connect to PostgreSQL at postgres://postgres@" + closed}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := walcount(t, tt.env, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			for _, want := range tt.says {
				if !strings.Contains(stdout+stderr, want) {
					t.Errorf("output does not say %q", want)
				}
			}
		})
	}
	t.Run("--version says what version says", func(t *testing.T) {
		t.Parallel()
		_, a, _ := walcount(t, nil, "version")
		_, b, _ := walcount(t, nil, "--version")
		if a != b || !strings.HasPrefix(a, "walcount ") {
			t.Errorf("walcount version printed %q, walcount --version %q", a, b)
		}
	})
}

// TestOperatorCommandsExitCodes follows an operator through the real binary
// with every setting in the environment: status before the daemon runs
// (exit 1: the slot is inactive), with it (0), with Redis unreachable (1);
// reconcile against a daemon that requires a token (1 without it), and
// --dry-run's exit code with and without drift (3 and 0). status and
// reconcile find the daemon through WALCOUNT_HTTP_ADDR, as run does.
func TestOperatorCommandsExitCodes(t *testing.T) {
	t.Parallel()
	const token = "op-token-4f1c9"
	c := newCLI(t, testenv.Database(t), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 30) g;")
	addr := unusedAddr(t)
	env := []string{
		"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms",
	}
	withToken := append(env[:len(env):len(env)], "WALCOUNT_HTTP_TOKEN="+token)

	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	code, out, _ := walcount(t, env, "status")
	if code != exitFailure || !says(out, "WARNING: the slot is INACTIVE") ||
		!strings.Contains(out, "no daemon answers at "+addr) || !strings.Contains(out, "--http-addr or WALCOUNT_HTTP_ADDR") {
		t.Fatalf("status without a daemon: exit %d, want %d with the INACTIVE warning and the address tried", code, exitFailure)
	}

	run := startWalcount(t, withToken, "run")
	waitStreaming(t, run, addr)
	raw, err := fetchDaemonStatus(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), token) {
		t.Errorf("/status shows the HTTP token:\n%s", raw)
	}

	code, out, _ = walcount(t, env, "status")
	if code != exitOK || !says(out, "daemon streaming") || !says(out, "apply lag") || strings.Contains(out, "WARNING") {
		t.Errorf("status with a streaming daemon: exit %d, want 0 and no warning:\n%s", code, out)
	}
	code, out, _ = walcount(t, env, "status", "--redis-url", "redis://"+unusedAddr(t)+"/0")
	if code != exitFailure || !strings.Contains(out, "WARNING: redis does not answer") {
		t.Errorf("status with Redis unreachable: exit %d, want %d and a warning:\n%s", code, exitFailure, out)
	}

	// The daemon backfills its new counter first; drift injected before
	// that would be corrected by the backfill.
	poll(t, "the backfill to finish", func() (bool, string) {
		st, err := fetchReconcileStatus(context.Background(), addr)
		if err != nil {
			return false, err.Error()
		}
		return st.Current == nil && st.Last != nil, fmt.Sprintf("%+v", st)
	})
	if _, err := c.conn.Exec(context.Background(), `INSERT INTO likes (post_id) SELECT 1 + g % 30 FROM generate_series(1, 300) g`); err != nil {
		t.Fatal(err)
	}

	code, _, errOut := walcount(t, env, "reconcile", "--dry-run")
	if code != exitFailure || !strings.Contains(errOut, "requires a token") || !strings.Contains(errOut, "WALCOUNT_HTTP_TOKEN") {
		t.Errorf("reconcile without the token: exit %d, want %d saying a token is required", code, exitFailure)
	}
	code, out, _ = walcount(t, withToken, "reconcile", "--dry-run")
	if code != exitOK || !strings.Contains(out, "30 keys checked, 0 drifted") {
		t.Errorf("reconcile --dry-run without drift: exit %d, want 0 and no drift", code)
	}
	if _, err := c.conn.Exec(context.Background(), `UPDATE posts SET likes_count = likes_count + 4 WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	code, out, _ = walcount(t, withToken, "reconcile", "--dry-run")
	if code != exitDrift || !strings.Contains(out, "drift: counter post_likes key 3") {
		t.Errorf("reconcile --dry-run with drift: exit %d, want %d naming key 3", code, exitDrift)
	}
	code, out, _ = walcount(t, withToken, "reconcile")
	if code != exitOK || !strings.Contains(out, "1 drifted, 1 corrected") {
		t.Errorf("reconcile: exit %d, want 0 and the correction", code)
	}
	poll(t, "every post to be exact after the correction", func() (bool, string) {
		n := c.count(`SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes WHERE post_id = p.id)`)
		return n == 0, fmt.Sprintf("%d posts off", n)
	})
	code, _, _ = walcount(t, withToken, "reconcile", "--dry-run")
	if code != exitOK {
		t.Errorf("reconcile --dry-run after the correction: exit %d, want 0", code)
	}

	if code := run.stop(); code != exitOK {
		t.Errorf("run after SIGTERM: exit %d, want 0", code)
	}
	if strings.Contains(run.stderr.String(), token) {
		t.Errorf("the daemon's log shows the HTTP token")
	}
	if strings.Contains(run.stderr.String(), "listens beyond loopback") {
		t.Errorf("the daemon warns about a loopback address with a token set")
	}
}

// TestDemoPlainOutputHasALegend runs walcount demo with its output in a
// pipe: the line per second comes after a legend, printed once.
func TestDemoPlainOutputHasALegend(t *testing.T) {
	t.Parallel()
	pg, rs := testenv.Postgres(t), testenv.Redis(t)
	code, out, _ := walcount(t, nil, "demo", "--database-url", pg.URL(), "--redis-url", rs.URL(), "--duration", "2s", "--clients", "2", "--posts", "50", "--flush-interval", "200ms")
	if code != exitOK {
		t.Fatalf("demo: exit %d, want 0", code)
	}
	legend := strings.Index(out, "one line per second")
	first := strings.Index(out, "\nt=")
	if legend < 0 || first < 0 || legend > first || strings.Count(out, "one line per second") != 1 {
		t.Fatalf("want the legend once, before the first line (legend at %d, first line at %d):\n%s", legend, first, out)
	}
	if !strings.Contains(out[legend:first], "top=#ID:C/N") {
		t.Errorf("the legend does not explain top=:\n%s", out[legend:first])
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("escape sequences in the plain output")
	}
}
