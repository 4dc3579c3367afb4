package servers_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// startRedisSentinel starts a sentinel setup that the test's cleanup
// closes, and prints the logs when the test failed.
func startRedisSentinel(tb testing.TB, opt servers.RedisSentinelOptions) *servers.RedisSentinel {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	s, err := servers.StartRedisSentinel(ctx, opt)
	if err != nil {
		tb.Fatalf("StartRedisSentinel: %v", err)
	}
	tb.Logf("sentinel setup of %d data nodes and %d sentinels started in %v",
		len(s.Nodes()), len(s.Sentinels()), time.Since(began).Round(time.Millisecond))
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("sentinel setup logs:\n%s", s.LogTails(30))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("close sentinel setup: %v", err)
		}
	})
	return s
}

// sentinelFailover writes metaKey through client, kills the master, and
// checks that the client writes to the new master and that the sentinels
// agree on it.
func sentinelFailover(t *testing.T, s *servers.RedisSentinel, client *redis.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*failoverTimeout)
	defer cancel()
	if err := client.HSet(ctx, metaKey, "gen", 1).Err(); err != nil {
		t.Fatalf("HSET before failover: %v", err)
	}
	killed := time.Now()
	old, err := s.KillMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	took := writeUntilOK(t, killed, func(ctx context.Context) error {
		return client.HSet(ctx, metaKey, "gen", 2).Err()
	})
	t.Logf("sentinel: first successful write %v after SIGKILL of master %s", took.Round(time.Millisecond), old.Name())

	newAddr, err := s.WaitNewMaster(ctx, old.Addr())
	if err != nil {
		t.Fatalf("WaitNewMaster: %v", err)
	}
	t.Logf("sentinel: WaitNewMaster returned %v after the kill", time.Since(killed).Round(time.Millisecond))
	if newAddr == old.Addr() {
		t.Fatalf("WaitNewMaster returned the old master %s", newAddr)
	}
	if got, err := s.Master(ctx); err != nil || got != newAddr {
		t.Fatalf("Master() after failover = %q, %v; want %s", got, err, newAddr)
	}
	if err := client.HSet(ctx, metaKey, "gen", 3).Err(); err != nil {
		t.Fatalf("HSET after failover: %v", err)
	}
	if got, err := client.HGet(ctx, metaKey, "gen").Result(); err != nil || got != "3" {
		t.Fatalf("HGET after failover = %q, %v; want 3", got, err)
	}
	// The old master comes back empty and as a master until the sentinels
	// reconfigure it; the client must stay with the sentinels' choice.
	if err := s.Start(ctx, old); err != nil {
		t.Fatalf("Start(%s): %v", old.Name(), err)
	}
	if err := client.HSet(ctx, metaKey, "gen", 4).Err(); err != nil {
		t.Fatalf("HSET after restarting the old master: %v", err)
	}
	if got, err := client.HGet(ctx, metaKey, "gen").Result(); err != nil || got != "4" {
		t.Fatalf("HGET after restarting the old master = %q, %v; want 4", got, err)
	}
}

func TestRedisSentinelFailover(t *testing.T) {
	// testenv's helper starts the default setup: master "walcount", one
	// replica, three sentinels; this test covers the helper too.
	began := time.Now()
	s := testenv.RedisSentinel(t)
	t.Logf("sentinel setup started in %v", time.Since(began).Round(time.Millisecond))
	want := "redis+sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/walcount/0"
	if s.URL() != want {
		t.Errorf("URL() = %q, want %q", s.URL(), want)
	}
	if len(s.SentinelAddrs()) != 3 || len(s.Nodes()) != 2 {
		t.Fatalf("%d sentinels and %d data nodes, want 3 and 2", len(s.SentinelAddrs()), len(s.Nodes()))
	}
	if m, err := s.Master(context.Background()); err != nil || m != s.Nodes()[0].Addr() {
		t.Fatalf("Master() = %q, %v; want %s", m, err, s.Nodes()[0].Addr())
	}
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    s.MasterName(),
		SentinelAddrs: s.SentinelAddrs(),
		DialTimeout:   time.Second,
		ReadTimeout:   time.Second,
		WriteTimeout:  time.Second,
	})
	defer client.Close()
	sentinelFailover(t, s, client)
}

func TestRedisSentinelTLSAndACL(t *testing.T) {
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	user := servers.RedisUser{
		Name:     "walcount",
		Password: "s3cret",
		Rules:    []string{"~walcount:*", "+@all", "-@dangerous"},
	}
	s := startRedisSentinel(t, servers.RedisSentinelOptions{
		Replicas: 1,
		TLS:      &files, RequireClientCert: true,
		Users: []servers.RedisUser{user}, DisableDefaultUser: true,
		SentinelPassword: "sentinel-secret",
	})
	u, err := url.Parse(s.URL())
	if err != nil {
		t.Fatalf("parse URL %q: %v", s.URL(), err)
	}
	if pw, _ := u.User.Password(); u.Scheme != "rediss+sentinel" || u.User.Username() != "walcount" || pw != "s3cret" ||
		u.Path != "/walcount/0" || u.Query().Get("sentinel_password") != "sentinel-secret" {
		t.Errorf("URL() = %q, want rediss+sentinel://walcount:s3cret@.../walcount/0?sentinel_password=sentinel-secret", s.URL())
	}
	tlsConfig, err := servers.RedisTLSConfig(files, true)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:       s.MasterName(),
		SentinelAddrs:    s.SentinelAddrs(),
		SentinelPassword: s.SentinelPassword(),
		Username:         user.Name,
		Password:         user.Password,
		TLSConfig:        tlsConfig,
		DialTimeout:      time.Second,
		ReadTimeout:      time.Second,
		WriteTimeout:     time.Second,
	})
	defer client.Close()
	ctx := context.Background()
	if err := client.Set(ctx, "other", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("SET other as %s = %v, want NOPERM", user.Name, err)
	}
	anonymous := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs()[0], TLSConfig: tlsConfig, MaxRetries: -1})
	defer anonymous.Close()
	if err := anonymous.GetMasterAddrByName(ctx, s.MasterName()).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME without the sentinel password = %v, want NOAUTH", err)
	}
	sentinelFailover(t, s, client)
}
