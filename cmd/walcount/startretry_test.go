package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// readyz returns the status code and body of the daemon's /readyz, or 0
// when it does not answer.
func readyz(addr string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRunWaitsForServersAtStart starts walcount run while Redis, or
// PostgreSQL, does not answer, as right after a Redis Cluster master was
// killed or while PostgreSQL restarts. That is transient: run used to exit 1
// at once and stay dead without a supervisor. Now it retries with backoff,
// /readyz answers 503 with the reason meanwhile and /status counts the
// failures, and once the server is back it streams and counts exactly. A
// configuration problem still exits 2 at once.
func TestRunWaitsForServersAtStart(t *testing.T) {
	t.Parallel()
	for _, down := range []string{"redis", "postgres"} {
		t.Run(down, func(t *testing.T) {
			t.Parallel()
			c := newSharedCluster(t, testenv.Postgres(t), testenv.Redis(t))
			rd := c.redis
			ctx := context.Background()
			var restart func() error
			switch down {
			case "redis":
				if err := rd.Kill(); err != nil {
					t.Fatal(err)
				}
				restart = func() error { return rd.Start(ctx) }
			case "postgres":
				if err := c.pg.Stop(ctx, servers.StopFast); err != nil {
					t.Fatal(err)
				}
				restart = func() error { return c.pg.Start(ctx) }
			}
			addr := unusedAddr(t)
			p := startWalcount(t, nil, c.cmd("run", "--http-addr", addr, "--flush-interval", "100ms")...)
			poll(t, "/readyz to fail with the reason while "+down+" is down, and a retry", func() (bool, string) {
				select {
				case <-p.done:
					t.Fatalf("walcount run exited while %s was down:\n%s", down, p.stderr.String())
				default:
				}
				code, body := readyz(addr)
				var st struct {
					Failures int `json:"consecutive_failures"`
				}
				if raw, err := fetchDaemonStatus(ctx, addr); err == nil {
					_ = json.Unmarshal(raw, &st)
				}
				return code == http.StatusServiceUnavailable && strings.Contains(body, down) && st.Failures >= 2,
					fmt.Sprintf("/readyz %d %s; /status consecutive_failures %d", code, strings.TrimSpace(body), st.Failures)
			})
			if err := restart(); err != nil {
				t.Fatal(err)
			}
			waitStreaming(t, p, addr)
			c.connect(t).Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 200) g`) //nolint:errcheck // checked by the count
			poll(t, "the counts to reach 200", func() (bool, string) {
				got := c.scalar(t, `SELECT coalesce(sum(likes_count), 0)::text FROM posts`)
				return got == "200", "sum(likes_count) " + got
			})
			if code := p.stop(); code != exitOK {
				t.Errorf("walcount run exited %d after SIGTERM, want 0", code)
			}
		})
	}
	t.Run("configuration problem", func(t *testing.T) {
		t.Parallel()
		rd := testenv.Redis(t)
		if err := rd.Kill(); err != nil {
			t.Fatal(err)
		}
		// The servers are down too: the configuration is refused first.
		code, _, stderr := walcount(t, nil, "run", "--database-url", "postgres://nobody@127.0.0.1:1/x", "--redis-url", rd.URL(), "--flush-interval", "0s", "--http-addr", "")
		if code != exitUsage || !strings.Contains(stderr, "--flush-interval") {
			t.Errorf("run with flush_interval 0s and no servers: exit %d, want %d at once, naming the setting", code, exitUsage)
		}
	})
}
