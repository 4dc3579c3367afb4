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
// named in present (go, postgres, redis-server, promtool, systemd-analyze).
func fakeTools(t *testing.T, present ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, util := range []string{"sed", "dirname", "readlink", "sort", "grep", "mktemp", "rm", "mkdir", "cp", "mv", "chmod"} {
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
	return ensureDepsCache(t, path, t.TempDir(), args...)
}

// ensureDepsCache is ensureDeps with the tools cache in cache.
func ensureDepsCache(t *testing.T, path, cache string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"ensure-deps.sh"}, args...)...)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir(), "WALCOUNT_TOOLS_CACHE=" + cache}
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
// redis-server but not promtool, and that make test needs promtool and
// systemd-analyze too, and says how to get promtool without installing the
// prometheus package. /usr/lib/postgresql and /usr/bin/redis-server are
// looked at directly too, so only promtool and systemd-analyze can be shown
// missing on a machine that has them.
func TestEnsureDepsPerTarget(t *testing.T) {
	withoutPromtool := fakeTools(t, "go", "postgres", "redis-server", "systemd-analyze")
	for _, target := range []string{"demo", "bench"} {
		if code, out := ensureDeps(t, withoutPromtool, target); code != 0 || out != "" {
			t.Errorf("ensure-deps.sh %s without promtool: exit %d, output %q; want 0 and nothing", target, code, out)
		}
	}
	for _, args := range [][]string{{"test"}, nil} {
		code, out := ensureDeps(t, withoutPromtool, args...)
		if code != 1 || !strings.Contains(out, "promtool") || !strings.Contains(out, "dpkg -x prometheus_*.deb") ||
			strings.Contains(out, "apt-get install") {
			t.Errorf("ensure-deps.sh %v without promtool: exit %d, want 1 saying how to extract promtool, installing no package:\n%s", args, code, out)
		}
	}
	withoutAnalyze := fakeTools(t, "go", "postgres", "redis-server", "promtool")
	if code, out := ensureDeps(t, withoutAnalyze, "test"); code != 1 || !strings.Contains(out, "systemd-analyze") ||
		!strings.Contains(out, "apt-get install -y --no-install-recommends systemd\n") {
		t.Errorf("ensure-deps.sh test without systemd-analyze: exit %d, want 1 naming only the systemd package:\n%s", code, out)
	}
	if code, out := ensureDeps(t, withoutAnalyze, "demo"); code != 0 || out != "" {
		t.Errorf("ensure-deps.sh demo without systemd-analyze: exit %d, output %q; want 0 and nothing", code, out)
	}
	all := fakeTools(t, "go", "postgres", "redis-server", "promtool", "systemd-analyze")
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

// TestEnsureDepsExtractsPromtool gives ensure-deps.sh an apt-get and a dpkg
// that log their arguments (apt-get download writes a stand-in .deb, dpkg
// -x unpacks a promtool from it) and checks that promtool lands in the
// tools cache, where the tests look, without any package being installed;
// a second run finds it there and does nothing.
func TestEnsureDepsExtractsPromtool(t *testing.T) {
	path := fakeTools(t, "go", "postgres", "redis-server", "systemd-analyze")
	log := filepath.Join(t.TempDir(), "calls")
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(path, name), []byte("#!/bin/sh\necho \"$0 $*\" >>"+log+"\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("apt-get", `[ "$1" = download ] && [ "$3" = prometheus ] && echo deb >prometheus_2.42.0_amd64.deb`)
	write("dpkg", `[ "$1" = -x ] && [ -f "$2" ] && mkdir -p "$3/usr/bin" && printf '#!/bin/sh\necho promtool stand-in\n' >"$3/usr/bin/promtool" && chmod +x "$3/usr/bin/promtool"`)
	cache := t.TempDir()
	code, out := ensureDepsCache(t, path, cache, "test")
	if code != 0 || !strings.Contains(out, "extracted promtool") {
		t.Errorf("ensure-deps.sh test: exit %d, want 0 saying it extracted promtool:\n%s", code, out)
	}
	if st, err := os.Stat(filepath.Join(cache, "bin", "promtool")); err != nil || st.Mode()&0o100 == 0 {
		t.Errorf("promtool is not an executable in the tools cache: %v", err)
	}
	calls, _ := os.ReadFile(log)
	if strings.Contains(string(calls), "install") || !strings.Contains(string(calls), "apt-get download") {
		t.Errorf("ensure-deps.sh ran, want apt-get download and dpkg -x only:\n%s", calls)
	}
	if code, out := ensureDepsCache(t, path, cache, "test"); code != 0 || out != "" {
		t.Errorf("ensure-deps.sh test with promtool in the cache: exit %d, output %q; want 0 and nothing", code, out)
	}
}
