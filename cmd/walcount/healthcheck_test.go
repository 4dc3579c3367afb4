package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/walcount/walcount/internal/httpapi"
)

// TestHealthcheck runs walcount healthcheck through the real binary
// against walcount's own HTTP server: /healthz answers 200 whether or not
// the daemon is ready, --ready follows /readyz, and a daemon that does not
// answer, an HTTP API that is off and a bad setting all exit 1 (never 2,
// which Docker reserves) with the reason.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	srv := httpapi.New(httpapi.Options{
		Addr: "127.0.0.1:0",
		Ready: func(context.Context) error {
			if ready.Load() {
				return nil
			}
			return errors.New("not streaming yet")
		},
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	addr := srv.Addr()
	_, port, _ := net.SplitHostPort(addr)

	check := func(name string, env []string, code int, says string, args ...string) {
		t.Helper()
		got, stdout, stderr := walcount(t, env, append([]string{"healthcheck"}, args...)...)
		if got != code {
			t.Errorf("%s: exit %d, want %d", name, got, code)
		}
		if !strings.Contains(stdout+stderr, says) {
			t.Errorf("%s: output does not say %q:\n%s%s", name, says, stdout, stderr)
		}
	}
	check("healthz, not ready", nil, exitOK, "", "--http-addr", addr)
	check("readyz, not ready", nil, exitFailure, "503 Service Unavailable: not ready: not streaming yet", "--http-addr", addr, "--ready")
	check("address from the environment", []string{"WALCOUNT_HTTP_ADDR=" + addr}, exitFailure, "not streaming yet", "--ready")
	ready.Store(true)
	check("readyz, ready", nil, exitOK, "", "--http-addr", addr, "--ready")
	// The image listens on 0.0.0.0:9750; its HEALTHCHECK asks loopback.
	check("wildcard listen address", []string{"WALCOUNT_HTTP_ADDR=0.0.0.0:" + port}, exitOK, "")
	check("empty host", []string{"WALCOUNT_HTTP_ADDR=:" + port}, exitOK, "", "--ready")

	closed := unusedAddr(t)
	check("nothing listens", nil, exitFailure, "is walcount run listening on "+closed, "--http-addr", closed)
	check("HTTP API off", nil, exitFailure, "the HTTP API is off", "--http-addr", "")
	check("bad setting", []string{"WALCOUNT_FLUSH_INTERVAL=often"}, exitFailure, `"often" is not a duration`, "--http-addr", addr)
	check("address without a port", nil, exitFailure, `"localhost" is not host:port`, "--http-addr", "localhost")
}
