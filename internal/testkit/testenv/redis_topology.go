package testenv

import (
	"context"
	"testing"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// redisTopologyLogLines is how much of each node's log a failed test
// prints; a topology has several nodes, so it is less than
// logLinesOnFailure.
const redisTopologyLogLines = 20

// redisTopologyHint tells what the Redis topologies need. Unlike RedisURL,
// they cannot fall back to WALCOUNT_TEST_REDIS_URL or Docker: the test
// kills their processes.
const redisTopologyHint = "Redis clusters, sentinels and TLS servers need the local redis-server binary (>= 7.0): " +
	"install it with `apt-get install redis-server`"

// RedisCluster starts a private Redis Cluster that the test may kill nodes
// of, and closes it when the test ends. Without opts it has three masters
// with one replica each; opts, at most one, are passed to
// servers.StartRedisCluster as they are. It needs the local redis-server
// binary; when the test fails, the tails of the nodes' logs are printed.
func RedisCluster(tb testing.TB, opts ...servers.RedisClusterOptions) *servers.RedisCluster {
	tb.Helper()
	opt := servers.RedisClusterOptions{Masters: 3, ReplicasPerMaster: 1}
	switch len(opts) {
	case 0:
	case 1:
		opt = opts[0]
	default:
		tb.Fatalf("testenv.RedisCluster: got %d option values, want at most 1", len(opts))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := servers.StartRedisCluster(ctx, opt)
	if err != nil {
		tb.Fatalf("testenv: %v\n(%s)", err, redisTopologyHint)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("redis cluster logs:\n%s", c.LogTails(redisTopologyLogLines))
		}
		if err := c.Close(); err != nil {
			tb.Errorf("testenv: close redis cluster: %v", err)
		}
	})
	return c
}

// RedisSentinel starts a private master with one replica, watched by three
// sentinels under the master name "walcount", and closes them when the
// test ends. opts, at most one, are passed to servers.StartRedisSentinel
// instead. It needs the local redis-server binary; when the test fails,
// the tails of the processes' logs are printed.
func RedisSentinel(tb testing.TB, opts ...servers.RedisSentinelOptions) *servers.RedisSentinel {
	tb.Helper()
	opt := servers.RedisSentinelOptions{MasterName: "walcount", Replicas: 1, Sentinels: 3}
	switch len(opts) {
	case 0:
	case 1:
		opt = opts[0]
	default:
		tb.Fatalf("testenv.RedisSentinel: got %d option values, want at most 1", len(opts))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := servers.StartRedisSentinel(ctx, opt)
	if err != nil {
		tb.Fatalf("testenv: %v\n(%s)", err, redisTopologyHint)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("redis sentinel logs:\n%s", s.LogTails(redisTopologyLogLines))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("testenv: close redis sentinel: %v", err)
		}
	})
	return s
}

// RedisTLS starts a private TLS-only redis-server with the ACL users, and
// closes it when the test ends. Its certificates come from a fresh CA in a
// directory of the test (see servers.MakeTLSFiles); clients need
// r.ClientTLSConfig(false), as client certificates are not required. The
// default user stays enabled without a password unless users redefine it,
// e.g. servers.RedisUser{Name: "default", Rules: []string{"off"}}; r.URL()
// logs in as the first user. It needs the local redis-server binary; when
// the test fails, the server's log tail is printed.
func RedisTLS(tb testing.TB, users ...servers.RedisUser) *servers.RedisTLS {
	tb.Helper()
	files, err := servers.MakeTLSFiles(tb.TempDir(), "walcount")
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	r, err := servers.StartRedisTLS(ctx, servers.RedisTLSOptions{TLS: files, Users: users})
	if err != nil {
		tb.Fatalf("testenv: %v\n(%s)", err, redisTopologyHint)
	}
	closeAtEnd(tb, "redis", r)
	return r
}
