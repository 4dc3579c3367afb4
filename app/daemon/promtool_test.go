package daemon

import (
	"bytes"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestPromtoolCheckMetrics runs `promtool check metrics` (Prometheus's
// linter of names, types and help) on a live daemon's /metrics after a
// workload, when every series exists: it must find no problem. promtool
// is found in PATH or in make deps' tools cache, as deploy's tests find
// it, and a missing one fails the test.
func TestPromtoolCheckMetrics(t *testing.T) {
	t.Parallel()
	promtool, err := testenv.Promtool()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	s := e.serve()
	s.waitReadyz(t, http.StatusOK, "the daemon to be ready", nil)
	w := newWorkload(e.db)
	w.run(t.Context(), 2, 50)
	e.waitCaughtUp(catchUp)

	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if err != nil || strings.TrimSpace(out.String()) != "" {
		t.Fatalf("promtool check metrics on a live /metrics: %v\n%s", err, out.String())
	}
}
