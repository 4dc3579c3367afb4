package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryCarriesNoTestKit: the walcount binary, which runs against
// production databases, links no package of the test kit (the code that
// runs initdb, chowns directories and starts servers).
func TestBinaryCarriesNoTestKit(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for pkg := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(pkg, "github.com/walcount/walcount/internal/testkit") {
			t.Errorf("walcount links %s", pkg)
		}
	}
}
