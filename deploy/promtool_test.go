package deploy_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// toolsCache is where scripts/ensure-deps.sh puts the tools it extracts
// or builds rather than installs (WALCOUNT_TOOLS_CACHE).
func toolsCache() string { return testenv.ToolsCache() }

// promtool returns the path of the promtool binary: the one in PATH, else
// the one make deps extracted into the tools cache. The rules are only
// trustworthy once promtool has checked them, so a missing promtool fails
// the test instead of skipping it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := testenv.Promtool()
	if err != nil {
		t.Fatal(err)
	}
	return path
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
