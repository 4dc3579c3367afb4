package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// goTool runs go-tool.sh with PATH and the tools cache given and returns
// its exit code, stdout and stderr.
func goTool(t *testing.T, path, cache string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"go-tool.sh"}, args...)...)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir(), "WALCOUNT_TOOLS_CACHE=" + cache}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// TestGoTool gives go-tool.sh a go that logs its arguments and "installs"
// a stand-in into GOBIN: the first call builds the pinned version into the
// cache and prints its path, the second finds it there and builds nothing,
// and an unknown tool is a usage error.
func TestGoTool(t *testing.T) {
	path := fakeTools(t)
	for _, util := range []string{"flock"} {
		if p, err := exec.LookPath(util); err == nil {
			if err := os.Symlink(p, filepath.Join(path, util)); err != nil {
				t.Fatal(err)
			}
		}
	}
	log := filepath.Join(t.TempDir(), "calls")
	fakeGo := "#!/bin/sh\necho \"$*\" >>" + log + "\n" +
		`[ "$1" = install ] && printf '#!/bin/sh\necho stand-in\n' >"$GOBIN/helm" && chmod +x "$GOBIN/helm"` + "\n"
	if err := os.WriteFile(filepath.Join(path, "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	want := filepath.Join(cache, "helm-v3.22.0", "helm")
	for i := range 2 {
		code, stdout, stderr := goTool(t, path, cache, "helm")
		if code != 0 || stdout != want+"\n" {
			t.Fatalf("call %d: go-tool.sh helm: exit %d, stdout %q, want 0 and %q\n%s", i+1, code, stdout, want, stderr)
		}
	}
	if out, err := exec.Command(want).Output(); err != nil || string(out) != "stand-in\n" {
		t.Errorf("%s: %q, %v", want, out, err)
	}
	calls, _ := os.ReadFile(log)
	if string(calls) != "install helm.sh/helm/v3/cmd/helm@v3.22.0\n" {
		t.Errorf("go was run as %q, want one go install of the pinned helm", calls)
	}
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".helm-") {
			t.Errorf("a temporary build directory %s is left in the cache", e.Name())
		}
	}
	if code, _, stderr := goTool(t, path, cache, "kubectl"); code != 2 || !strings.Contains(stderr, "unknown tool") {
		t.Errorf("go-tool.sh kubectl: exit %d, want 2 saying the tool is unknown:\n%s", code, stderr)
	}
}
