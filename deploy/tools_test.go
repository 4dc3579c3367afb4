package deploy_test

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// goTool returns the path of a pinned Go tool, built once into the tools
// cache by scripts/go-tool.sh.
func goTool(t *testing.T, name string) string {
	t.Helper()
	cmd := exec.Command("sh", "../scripts/go-tool.sh", name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/go-tool.sh %s: %v\n%s", name, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
