// Package scripts_test checks the shell scripts of the build.
package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeTools makes a directory to serve as the whole PATH of ensure-deps.sh:
// the few utilities it runs, a non-root id, and stand-ins for the tools
// named in present (go, postgres, redis-server, promtool).
func fakeTools(t *testing.T, present ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, util := range []string{"sed", "dirname", "readlink", "sort"} {
		p, err := exec.LookPath(util)
		if err != nil {
			t.Fatalf("%s: %v", util, err)
		}
		if err := os.Symlink(p, filepath.Join(dir, util)); err != nil {
			t.Fatal(err)
		}
	}
	script := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Not root: the script must say what to install, never run apt-get.
	script("id", "echo 1000")
	for _, tool := range present {
		switch tool {
		case "postgres":
			script("postgres", "echo 'postgres (PostgreSQL) 15.4'")
			script("initdb", "exit 0")
			script("pg_ctl", "exit 0")
		default:
			script(tool, "exit 0")
		}
	}
	return dir
}

func ensureDeps(t *testing.T, path string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"ensure-deps.sh"}, args...)...)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// TestEnsureDepsPerTarget checks that make demo needs PostgreSQL and
// redis-server but not promtool, and that make test needs promtool too.
// /usr/lib/postgresql and /usr/bin/redis-server are looked at directly
// too, so only promtool can be shown missing on a machine that has them.
func TestEnsureDepsPerTarget(t *testing.T) {
	withoutPromtool := fakeTools(t, "go", "postgres", "redis-server")
	for _, target := range []string{"demo", "bench"} {
		if code, out := ensureDeps(t, withoutPromtool, target); code != 0 || out != "" {
			t.Errorf("ensure-deps.sh %s without promtool: exit %d, output %q; want 0 and nothing", target, code, out)
		}
	}
	for _, args := range [][]string{{"test"}, nil} {
		code, out := ensureDeps(t, withoutPromtool, args...)
		if code != 1 || !strings.Contains(out, "promtool") || !strings.Contains(out, "apt-get install -y --no-install-recommends prometheus\n") {
			t.Errorf("ensure-deps.sh %v without promtool: exit %d, want 1 naming only the prometheus package:\n%s", args, code, out)
		}
	}
	all := fakeTools(t, "go", "postgres", "redis-server", "promtool")
	if code, out := ensureDeps(t, all, "test"); code != 0 || out != "" {
		t.Errorf("ensure-deps.sh test with everything: exit %d, output %q; want 0 and nothing", code, out)
	}
	if code, out := ensureDeps(t, all, "nonsense"); code != 2 || !strings.Contains(out, "unknown target") {
		t.Errorf("ensure-deps.sh nonsense: exit %d, want 2 saying the target is unknown:\n%s", code, out)
	}
	if code, out := ensureDeps(t, fakeTools(t, "postgres", "redis-server"), "demo"); code != 1 || !strings.Contains(out, "go not found") {
		t.Errorf("ensure-deps.sh demo without go: exit %d, want 1 saying so:\n%s", code, out)
	}
}
