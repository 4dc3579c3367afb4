package main

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestStatusRedisDown runs the real binary's status against a Redis that
// is down (a port nothing listens on) and against one that accepts
// connections and closes them at once: the report says Redis does not
// answer, go-redis's own log lines (`redis: … pool.go:…`) are not
// printed, and each of status's Redis reads tries one connection, not a
// round of retries with backoff (8 raw lines and about 3 s before).
func TestStatusRedisDown(t *testing.T) {
	t.Parallel()
	walcountBinary(t) // built before anything is timed
	c := newCLI(t, testenv.Database(t), goodSchema)
	if code, out := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d\n%s", code, out)
	}
	check := func(t *testing.T, redisURL string) {
		t.Helper()
		began := time.Now()
		code, stdout, stderr := walcount(t, nil, "status", "--database-url", c.db, "--redis-url", redisURL, "--slot", c.slot, "--http-addr", "")
		t.Logf("status took %s", time.Since(began).Round(time.Millisecond))
		if code != exitFailure {
			t.Errorf("status: exit %d, want %d (a warning)", code, exitFailure)
		}
		if !strings.Contains(stdout, "redis does not answer") {
			t.Errorf("status does not say Redis does not answer:\n%s", stdout)
		}
		for _, line := range strings.Split(stderr, "\n") {
			if strings.Contains(line, "pool.go") || strings.HasPrefix(strings.TrimSpace(line), "redis:") || strings.Contains(line, "redis: ") {
				t.Errorf("a raw go-redis line on stderr: %s", line)
			}
		}
	}
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		check(t, "redis://"+unusedAddr(t)+"/0")
	})
	t.Run("closes connections", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		var conns atomic.Int64
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conns.Add(1)
				conn.Close()
			}
		}()
		check(t, "redis://"+l.Addr().String()+"/0")
		// status reads the buffer's meta, its length and the eviction
		// policy: without retries that is at most three connections.
		if n := conns.Load(); n == 0 || n > 3 {
			t.Errorf("status opened %d connections to a Redis that closes them; want one per read, at most 3", n)
		}
	})
}
