package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeInstall runs make install into a PREFIX and into a GOBIN, and
// runs the installed binary, whose version line names this checkout's
// commit (make build asks for VCS stamping, whatever GOFLAGS says).
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is not installed: %v", err)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v (the test runs in a git checkout)", err)
	}
	build := filepath.Join(t.TempDir(), "walcount")
	prefix, gobin := t.TempDir(), t.TempDir()
	for _, tc := range []struct {
		vars []string
		want string
	}{
		{[]string{"PREFIX=" + prefix}, filepath.Join(prefix, "bin", "walcount")},
		{[]string{"GOBIN=" + gobin}, filepath.Join(gobin, "walcount")},
	} {
		// BIN keeps the build out of the work tree's bin/.
		cmd := exec.Command("make", append([]string{"-C", "..", "install", "BIN=" + build}, tc.vars...)...)
		// The caller's PREFIX or GOBIN would decide otherwise.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "PREFIX=") && !strings.HasPrefix(kv, "GOBIN=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make install %v: %v\n%s", tc.vars, err, out)
		}
		if !strings.Contains(string(out), "installed "+tc.want) {
			t.Errorf("make install %v does not say where it installed (%s):\n%s", tc.vars, tc.want, out)
		}
		v, err := exec.Command(tc.want, "--version").Output()
		if err != nil || !strings.HasPrefix(string(v), "walcount ") || !strings.Contains(string(v), "(revision "+string(head[:12])+",") {
			t.Errorf("%s --version: %q, %v; want a line naming the commit %s", tc.want, v, err, head[:12])
		}
	}
}

// TestReadmeStartsWithDemoAndTest checks that the first two commands of
// README.md are the whole setup on a fresh machine: make demo, then make
// test.
func TestReadmeStartsWithDemoAndTest(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var commands []string
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode && strings.TrimSpace(line) != "" && len(commands) < 2 {
			f := strings.Fields(line)
			commands = append(commands, strings.Join(f[:min(2, len(f))], " "))
		}
	}
	if len(commands) != 2 || commands[0] != "make demo" || commands[1] != "make test" {
		t.Errorf("README.md's first two commands are %q, want make demo, then make test", commands)
	}
}

// TestReadmeSaysHowToInstall checks that README.md's first screen says how
// to get walcount on PATH before it uses the command.
func TestReadmeSaysHowToInstall(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	install, firstUse := -1, -1
	inCode := false
	for i, line := range lines {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if install < 0 && strings.Contains(line, "make install") && strings.Contains(line, "go install github.com/walcount/walcount/cmd/walcount@latest") {
			install = i
		}
		if inCode && firstUse < 0 && strings.HasPrefix(line, "walcount ") {
			firstUse = i
		}
	}
	if install < 0 {
		t.Fatal("README.md has no line with make install and go install github.com/walcount/walcount/cmd/walcount@latest")
	}
	if firstUse < install {
		t.Errorf("README.md runs walcount (line %d) before it says how to install it (line %d)", firstUse+1, install+1)
	}
	if install >= 40 {
		t.Errorf("the install line is line %d of README.md: not on its first screen", install+1)
	}
}
