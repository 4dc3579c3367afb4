package main

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// buildWalcount builds the walcount binary into a temporary directory, as
// the bench runs it, and returns the directory and the binary's path.
func buildWalcount(t *testing.T) (dir, bin string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "walcount")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/walcount").CombinedOutput(); err != nil {
		t.Fatalf("build walcount: %v\n%s", err, out)
	}
	return dir, bin
}
