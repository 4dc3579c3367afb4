package buffer_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/buffer/buffertest"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// leastPrivilege returns the ACL user "walcount" with exactly the rules
// walcount documents for a deployment of url's topology.
func leastPrivilege(t *testing.T, url string) servers.RedisUser {
	t.Helper()
	o, err := redisconn.Parse(url, redisconn.TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return servers.RedisUser{Name: "walcount", Password: "walcount-secret", Rules: strings.Fields(redisconn.ACLRules(o))}
}

// topologyClient returns a contract client factory for url with the TLS
// settings tlsOpt, made by redisconn as walcount makes its clients.
func topologyClient(url string, tlsOpt redisconn.TLSOptions) buffertest.Client {
	return func(t *testing.T) redis.UniversalClient {
		o, err := redisconn.Parse(url, tlsOpt)
		if err != nil {
			t.Fatal(err)
		}
		rdb := redisconn.New(o, nil)
		t.Cleanup(func() { rdb.Close() })
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			t.Fatalf("PING %s: %v", o.Redacted(), err)
		}
		return rdb
	}
}

// TestContractCluster runs the buffer contract on a Redis Cluster of three
// masters with a replica each, as a user with walcount's least-privilege
// ACL rules: the scripts' keys share one hash tag, so every script runs on
// one node.
func TestContractCluster(t *testing.T) {
	t.Parallel()
	user := leastPrivilege(t, "redis+cluster://h:1")
	c := testenv.RedisCluster(t, servers.RedisClusterOptions{Masters: 3, ReplicasPerMaster: 1, Users: []servers.RedisUser{user}})
	buffertest.Run(t, topologyClient(c.URL(), redisconn.TLSOptions{}))
}

// TestContractSentinel runs the buffer contract on a primary found through
// three password-protected sentinels, as a user with walcount's
// least-privilege ACL rules.
func TestContractSentinel(t *testing.T) {
	t.Parallel()
	user := leastPrivilege(t, "redis+sentinel://h:1/walcount")
	s := testenv.RedisSentinel(t, servers.RedisSentinelOptions{MasterName: "walcount", Replicas: 1, Sentinels: 3,
		Users: []servers.RedisUser{user}, SentinelPassword: "sentinel-secret"})
	if !strings.Contains(s.URL(), "sentinel_password=") {
		t.Fatal("the sentinel URL carries no sentinel_password")
	}
	buffertest.Run(t, topologyClient(s.URL(), redisconn.TLSOptions{}))
}

// TestContractTLS runs the buffer contract on a TLS-only Redis whose
// default user is off, as a user with walcount's least-privilege ACL
// rules, trusting only the test's CA.
func TestContractTLS(t *testing.T) {
	t.Parallel()
	user := leastPrivilege(t, "redis://h:1/0")
	r := testenv.RedisTLS(t, user, servers.RedisUser{Name: "default", Rules: []string{"off"}})
	buffertest.Run(t, topologyClient(r.URL(), redisconn.TLSOptions{CAFile: r.TLS().CAFile}))
}

// TestContractClusterTLS is TestContractCluster over TLS (rediss+cluster):
// TLS-only nodes, cluster bus and replication included, trusting only the
// test's CA.
func TestContractClusterTLS(t *testing.T) {
	t.Parallel()
	user := leastPrivilege(t, "rediss+cluster://h:1")
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	c := testenv.RedisCluster(t, servers.RedisClusterOptions{Masters: 3, ReplicasPerMaster: 1, TLS: &files, Users: []servers.RedisUser{user}})
	if !strings.HasPrefix(c.URL(), "rediss+cluster://") {
		t.Fatalf("URL %s is not rediss+cluster", c.URL())
	}
	buffertest.Run(t, topologyClient(c.URL(), redisconn.TLSOptions{CAFile: files.CAFile}))
}

// TestContractSentinelTLS is TestContractSentinel over TLS
// (rediss+sentinel): the sentinels and the data nodes speak TLS only.
func TestContractSentinelTLS(t *testing.T) {
	t.Parallel()
	user := leastPrivilege(t, "rediss+sentinel://h:1/walcount")
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	s := testenv.RedisSentinel(t, servers.RedisSentinelOptions{MasterName: "walcount", Replicas: 1, Sentinels: 3, TLS: &files,
		Users: []servers.RedisUser{user}, SentinelPassword: "sentinel-secret"})
	if !strings.HasPrefix(s.URL(), "rediss+sentinel://") {
		t.Fatalf("URL %s is not rediss+sentinel", s.URL())
	}
	buffertest.Run(t, topologyClient(s.URL(), redisconn.TLSOptions{CAFile: files.CAFile}))
}

// TestEvictionOnCluster: ReadEviction reads every master of a Cluster and
// reports the riskiest, since any of them may come to hold walcount's keys.
func TestEvictionOnCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.RedisCluster(t, servers.RedisClusterOptions{Masters: 3})
	rdb := topologyClient(c.URL(), redisconn.TLSOptions{})(t)
	e, err := buffer.ReadEviction(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if e.Risky() {
		t.Fatalf("a fresh cluster reads as risky: %+v", e)
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Admin()
	node := redis.NewClient(&redis.Options{Addr: masters[len(masters)-1].Addr(), Username: admin.Name, Password: admin.Password})
	defer node.Close()
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if err := node.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if e, err = buffer.ReadEviction(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if !e.Risky() || !e.Limited() || e.Policy != "allkeys-lru" {
		t.Errorf("one master with allkeys-lru and a limit reads as %+v, want it reported", e)
	}
}
