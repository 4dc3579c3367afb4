package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// toolsCache is where scripts/ensure-deps.sh puts the tools it extracts
// or builds rather than installs (WALCOUNT_TOOLS_CACHE).
func toolsCache() string {
	if d := os.Getenv("WALCOUNT_TOOLS_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/walcount/tools"
}

// promtool returns the path of the promtool binary: the one in PATH, else
// the one make deps extracted into the tools cache. The rules are only
// trustworthy once promtool has checked them, so a missing promtool fails
// the test instead of skipping it.
func promtool(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("promtool"); err == nil {
		return path
	}
	cached := filepath.Join(toolsCache(), "bin", "promtool")
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("promtool is neither in PATH nor at %s: run make deps (scripts/ensure-deps.sh test), "+
			"which extracts it from Debian's prometheus package without installing that", cached)
	}
	return cached
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = "prometheus"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestPromtoolCheckRules(t *testing.T) {
	runPromtool(t, "check", "rules", "alerts.yml")
}

func TestPromtoolTestRules(t *testing.T) {
	runPromtool(t, "test", "rules", "alerts_test.yml")
}
