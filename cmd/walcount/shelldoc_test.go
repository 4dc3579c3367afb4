package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestShellCompletion: the bash and zsh scripts the real binary writes are
// valid shell (bash -n), and completion offers the commands and the values
// of a setting with a fixed set, as the shells ask the binary for them
// (cobra's __complete).
func TestShellCompletion(t *testing.T) {
	t.Parallel()
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, out, stderr := walcount(t, nil, "completion", shell)
		if code != exitOK || !strings.Contains(out, "walcount") {
			t.Errorf("completion %s: exit %d\n%s", shell, code, stderr)
		}
		if shell == "bash" {
			cmd := exec.Command("bash", "-n")
			cmd.Stdin = strings.NewReader(out)
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("bash -n on the bash completion: %v\n%s", err, msg)
			}
		}
	}
	complete := func(args ...string) []string {
		t.Helper()
		code, out, stderr := walcount(t, nil, append([]string{cobra.ShellCompRequestCmd}, args...)...)
		if code != exitOK {
			t.Fatalf("__complete %v: exit %d\n%s", args, code, stderr)
		}
		var words []string
		for _, line := range strings.Split(out, "\n") {
			if line != "" && !strings.HasPrefix(line, ":") {
				w, _, _ := strings.Cut(line, "\t")
				words = append(words, w)
			}
		}
		return words
	}
	if got := complete("st"); strings.Join(got, " ") != "status" {
		t.Errorf("completing `walcount st`: %v, want status", got)
	}
	if got := complete("re"); strings.Join(got, " ") != "reconcile" {
		t.Errorf("completing `walcount re`: %v, want reconcile", got)
	}
	if got := complete("status", "--log-level", ""); strings.Join(got, " ") != "debug info warn error" {
		t.Errorf("completing --log-level: %v, want the levels", got)
	}
}

// TestManPages runs walcount man: one page per command, named as man
// expects, each with the command's name and summary; groff reads them
// without a warning; a second run writes the same bytes.
func TestManPages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if code, _, stderr := walcount(t, nil, "man", dir); code != exitOK {
		t.Fatalf("walcount man: exit %d\n%s", code, stderr)
	}
	var want func(c *cobra.Command)
	pages := map[string]string{}
	want = func(c *cobra.Command) {
		if !c.IsAvailableCommand() && c.Parent() != nil {
			return
		}
		pages[strings.ReplaceAll(c.CommandPath(), " ", "-")+".1"] = c.Short
		for _, sub := range c.Commands() {
			want(sub)
		}
	}
	want(newRootCmd())
	for name, short := range pages {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("no man page %s: %v", name, err)
			continue
		}
		text := string(data)
		if !strings.Contains(text, ".TH \"WALCOUNT\" \"1\"") || !strings.Contains(text, ".SH NAME") {
			t.Errorf("%s is not a section 1 man page", name)
		}
		words := strings.Fields(short)
		if len(words) > 0 && !strings.Contains(text, words[0]) {
			t.Errorf("%s does not hold the command's summary %q", name, short)
		}
	}
	if groff, err := exec.LookPath("groff"); err == nil {
		cmd := exec.Command(groff, append([]string{"-man", "-Tutf8", "-ww", "-z"}, filepath.Join(dir, "walcount-run.1"), filepath.Join(dir, "walcount.1"))...)
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("groff on the man pages: %v\n%s", err, out)
		}
	} else {
		t.Log("groff not in PATH: the pages were not rendered")
	}
	again := t.TempDir()
	if code, _, _ := walcount(t, nil, "man", again); code != exitOK {
		t.Fatal("second walcount man failed")
	}
	for name := range pages {
		a, _ := os.ReadFile(filepath.Join(dir, name))
		b, _ := os.ReadFile(filepath.Join(again, name))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two runs", name)
		}
	}
}
