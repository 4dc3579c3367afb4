package deploy_test

import (
	"os/exec"
	"strings"
	"testing"
)

// promtool returns the path of the promtool binary. The rules are only
// trustworthy once promtool has checked them, so a missing promtool fails
// the test instead of skipping it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found in PATH: install the prometheus package (promtool), "+
			"e.g. `apt-get install --no-install-recommends prometheus`: %v", err)
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
