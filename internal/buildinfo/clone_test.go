package buildinfo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitOut runs git in dir and returns its trimmed output.
func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// buildEnv is the environment of a build as a user runs it with Go's
// defaults: the test's own with GOFLAGS=-buildvcs=auto (the default), so
// that a -buildvcs=false in GOFLAGS or in the go env file (`go env -w`)
// cannot hide what a plain `go build` in a checkout records.
func buildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	return append(env, "GOFLAGS=-buildvcs=auto")
}

// buildAndVersion builds ./cmd/walcount in dir and returns what
// `walcount version` and `walcount --version` print.
func buildAndVersion(t *testing.T, dir string) (string, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "walcount")
	// -trimpath only so that the second build reuses the first one's
	// packages: it changes no build information.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/walcount")
	build.Dir, build.Env = dir, buildEnv()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/walcount in %s: %v\n%s", dir, err, out)
	}
	run := func(arg string) string {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("walcount %s: %v\n%s", arg, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	return run("version"), run("--version")
}

// TestVersionOfACloneNamesItsCommit clones this checkout's HEAD, builds
// walcount there with a plain go build (no -ldflags) and checks that the
// version line names the commit and a clean tree; then it changes a file
// and checks that the line says modified.
func TestVersionOfACloneNamesItsCommit(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is not installed (apt-get install git): %v", err)
	}
	root := gitOut(t, ".", "rev-parse", "--show-toplevel")
	head := gitOut(t, root, "rev-parse", "HEAD")
	clone := filepath.Join(t.TempDir(), "walcount")
	// --shared borrows the objects of this repository, so a detached HEAD
	// that no branch holds can be checked out too.
	gitOut(t, root, "clone", "--quiet", "--shared", "--no-checkout", root, clone)
	gitOut(t, clone, "checkout", "--quiet", "--detach", head)

	short := head[:12]
	version, flag := buildAndVersion(t, clone)
	t.Logf("clean clone of %s: %s", short, version)
	if version != flag {
		t.Errorf("walcount version printed %q, walcount --version %q", version, flag)
	}
	if !strings.Contains(version, "(revision "+short+",") {
		t.Errorf("version line %q does not name the commit %s", version, short)
	}
	if strings.Contains(version, "modified") {
		t.Errorf("version line %q of a clean clone says modified", version)
	}
	if strings.HasPrefix(version, "walcount dev ") {
		t.Errorf("version line %q: a build in a checkout has a pseudo-version, not dev", version)
	}

	f := filepath.Join(clone, "cmd", "walcount", "version.go")
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, append(b, "\n// a local change\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	version, _ = buildAndVersion(t, clone)
	t.Logf("modified clone: %s", version)
	if !strings.Contains(version, "(revision "+short+", modified,") {
		t.Errorf("version line %q of a modified clone does not say modified after the commit %s", version, short)
	}
}
