package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// defaultHealthcheckTimeout bounds walcount healthcheck's request.
const defaultHealthcheckTimeout = 5 * time.Second

// newHealthcheckCmd is walcount healthcheck: a GET of the daemon's /healthz
// (or /readyz) at the configured HTTP address, exit 0 on a 200 and 1
// otherwise. It is for images without a shell or curl (distroless), whose
// HEALTHCHECK can only run the binary itself. Every failure, a bad setting
// included, exits 1: Docker reserves 2.
func newHealthcheckCmd(g *globalFlags) *cobra.Command {
	var ready bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the daemon at --http-addr answers /healthz (or /readyz with --ready), else 1",
		Long: `healthcheck asks the walcount run daemon at the configured HTTP address
(--http-addr, WALCOUNT_HTTP_ADDR or http_addr) for GET /healthz, or GET
/readyz with --ready, and exits 0 when it answers 200 and 1 otherwise,
printing why. A wildcard listen address (0.0.0.0:9750, [::]:9750, :9750)
is asked on loopback. It is meant for a container HEALTHCHECK:

    HEALTHCHECK CMD ["/walcount", "healthcheck"]`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return healthFailure(cmd, err)
			}
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			if err := probe(cmd.Context(), cfg.HTTPAddr, path, timeout); err != nil {
				return healthFailure(cmd, err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&ready, "ready", false, "ask /readyz (streaming, PostgreSQL and Redis reachable) instead of /healthz (the process serves HTTP)")
	cmd.Flags().DurationVar(&timeout, "timeout", defaultHealthcheckTimeout, "how long to wait for the answer")
	return cmd
}

// healthFailure prints err and makes the command exit 1.
func healthFailure(cmd *cobra.Command, err error) error {
	fmt.Fprintln(cmd.ErrOrStderr(), "walcount healthcheck:", err)
	return exitCodeError{exitFailure}
}

// probe GETs path from the daemon listening on addr and fails unless it
// answers 200.
func probe(ctx context.Context, addr, path string, timeout time.Duration) error {
	if addr == "" {
		return fmt.Errorf("the HTTP API is off (http_addr is empty): set --http-addr or WALCOUNT_HTTP_ADDR to the address walcount run listens on")
	}
	target, err := dialAddr(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := "http://" + target + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w (is walcount run listening on %s?)", err, addr)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// dialAddr is the address to connect to for a listen address: a wildcard
// or empty host becomes loopback.
func dialAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("http address %q: %w", listen, err)
	}
	switch {
	case host == "", host == "0.0.0.0":
		host = "127.0.0.1"
	case host == "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}
