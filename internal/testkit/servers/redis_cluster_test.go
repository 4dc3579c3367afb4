package servers_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// metaKey is the kind of key walcount writes: its hash tag puts every key
// of a stream into one slot.
const metaKey = "walcount:{s}:meta"

// failoverTimeout bounds how long a test waits for a failover and for the
// first write after it. Failovers take a few seconds; the margin is for
// busy machines.
const failoverTimeout = 60 * time.Second

// startRedisCluster starts a cluster that the test's cleanup closes, and
// prints the nodes' logs when the test failed.
func startRedisCluster(tb testing.TB, opt servers.RedisClusterOptions) *servers.RedisCluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	c, err := servers.StartRedisCluster(ctx, opt)
	if err != nil {
		tb.Fatalf("StartRedisCluster: %v", err)
	}
	tb.Logf("cluster of %d nodes started in %v", len(c.Nodes()), time.Since(began).Round(time.Millisecond))
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("cluster logs:\n%s", c.LogTails(30))
		}
		if err := c.Close(); err != nil {
			tb.Errorf("close cluster: %v", err)
		}
	})
	return c
}

// writeUntilOK runs write until it succeeds and returns how long that took
// since from. Each attempt has its own short deadline, so that an attempt
// stuck on a dead node does not use up the test's time.
func writeUntilOK(tb testing.TB, from time.Time, write func(ctx context.Context) error) time.Duration {
	tb.Helper()
	var lastErr error
	// Failed attempts usually fail fast (connection refused,
	// CLUSTERDOWN); the poll keeps the loop from spinning on them.
	if wait.Until(failoverTimeout, 10*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		lastErr = write(ctx)
		cancel()
		return lastErr == nil
	}) {
		return time.Since(from)
	}
	tb.Fatalf("no successful write within %v; last error: %v", failoverTimeout, lastErr)
	return 0
}

// clusterFailover writes metaKey through client, kills the master that
// serves it, and checks that the client writes to the new master, that the
// cluster agrees who that is, and that the killed node rejoins as a
// replica.
func clusterFailover(t *testing.T, c *servers.RedisCluster, client *redis.ClusterClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*failoverTimeout)
	defer cancel()
	if err := client.HSet(ctx, metaKey, "gen", 1).Err(); err != nil {
		t.Fatalf("HSET before failover: %v", err)
	}
	old, err := c.MasterFor(ctx, metaKey)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatalf("Kill(%s): %v", old.Name(), err)
	}
	took := writeUntilOK(t, killed, func(ctx context.Context) error {
		return client.HSet(ctx, metaKey, "gen", 2).Err()
	})
	t.Logf("cluster: first successful write %v after SIGKILL of master %s", took.Round(time.Millisecond), old.Name())

	newMaster, err := c.WaitFailover(ctx, old)
	if err != nil {
		t.Fatalf("WaitFailover: %v", err)
	}
	t.Logf("cluster: WaitFailover returned %v after the kill", time.Since(killed).Round(time.Millisecond))
	if newMaster == nil || newMaster == old {
		t.Fatalf("WaitFailover returned %v, want a node other than %s", newMaster, old.Name())
	}
	if m, err := c.MasterFor(ctx, metaKey); err != nil || m != newMaster {
		t.Fatalf("MasterFor after failover = %v, %v; want %s", m, err, newMaster.Name())
	}
	if err := client.HSet(ctx, metaKey, "gen", 3).Err(); err != nil {
		t.Fatalf("HSET after failover: %v", err)
	}
	if got, err := client.HGet(ctx, metaKey, "gen").Result(); err != nil || got != "3" {
		t.Fatalf("HGET after failover = %q, %v; want 3", got, err)
	}

	if err := c.Start(ctx, old); err != nil {
		t.Fatalf("Start(%s): %v", old.Name(), err)
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		if m == old {
			t.Errorf("restarted %s serves slots again; want it to return as a replica", old.Name())
		}
	}
	if err := client.HSet(ctx, metaKey, "gen", 4).Err(); err != nil {
		t.Fatalf("HSET after restart: %v", err)
	}
}

func TestRedisClusterFailover(t *testing.T) {
	// testenv's helper starts the default cluster, three masters with a
	// replica each; this test covers the helper too.
	began := time.Now()
	c := testenv.RedisCluster(t)
	t.Logf("cluster of %d nodes started in %v", len(c.Nodes()), time.Since(began).Round(time.Millisecond))
	if n := len(c.Nodes()); n != 6 {
		t.Fatalf("%d nodes, want 6", n)
	}
	u, err := url.Parse(c.URL())
	if err != nil {
		t.Fatalf("parse URL %q: %v", c.URL(), err)
	}
	if u.Scheme != "redis+cluster" || u.Host != strings.Join(c.Addrs(), ",") || u.User != nil {
		t.Errorf("URL() = %q, want redis+cluster://%s", c.URL(), strings.Join(c.Addrs(), ","))
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs(),
		DialTimeout:  time.Second,
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
		// go-redis reloads the slot map on MOVED, but not when the master
		// of a slot stops answering: without this it keeps dialling the
		// dead master for the default 60 s.
		ClusterStateReloadInterval: time.Second,
	})
	defer client.Close()
	clusterFailover(t, c, client)
}

func TestRedisClusterTLSAndACL(t *testing.T) {
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	user := servers.RedisUser{
		Name:     "walcount",
		Password: "s3cret",
		// A cluster client needs CLUSTER SLOTS to find the nodes.
		Rules: []string{"~walcount:*", "+@all", "-@dangerous", "+cluster|slots", "+cluster|shards"},
	}
	c := startRedisCluster(t, servers.RedisClusterOptions{
		Masters: 3, ReplicasPerMaster: 1,
		TLS: &files, RequireClientCert: true,
		Users: []servers.RedisUser{user}, DisableDefaultUser: true,
	})
	if got, want := c.URL(), "rediss+cluster://walcount:s3cret@"+strings.Join(c.Addrs(), ","); got != want {
		t.Errorf("URL() = %q, want %q", got, want)
	}
	tlsConfig, err := servers.RedisTLSConfig(files, true)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs(),
		Username:     user.Name,
		Password:     user.Password,
		TLSConfig:    tlsConfig,
		DialTimeout:  time.Second,
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
		// go-redis reloads the slot map on MOVED, but not when the master
		// of a slot stops answering: without this it keeps dialling the
		// dead master for the default 60 s.
		ClusterStateReloadInterval: time.Second,
	})
	defer client.Close()
	ctx := context.Background()
	if err := client.Set(ctx, "other", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("SET other as %s = %v, want NOPERM", user.Name, err)
	}
	clusterFailover(t, c, client)
}

func TestRedisClusterClose(t *testing.T) {
	c := startRedisCluster(t, servers.RedisClusterOptions{Masters: 3})
	nodes := c.Nodes()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, n := range nodes {
		if n.Running() {
			t.Errorf("%s runs after Close", n.Name())
		}
	}
	if _, err := os.Stat(filepath.Dir(nodes[0].Dir())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory after Close: %v, want it removed", err)
	}
	if err := c.Start(context.Background(), nodes[0]); !errors.Is(err, servers.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
}
