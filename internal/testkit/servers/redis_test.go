package servers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// startRedis starts a redis-server that the test's cleanup closes.
func startRedis(tb testing.TB) *servers.Redis {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := servers.StartRedis(ctx, servers.RedisOptions{})
	if err != nil {
		tb.Fatalf("StartRedis: %v", err)
	}
	tb.Cleanup(func() {
		if err := r.Close(); err != nil {
			tb.Errorf("close redis: %v", err)
		}
	})
	return r
}

// redisClient opens a client that the test's cleanup closes.
func redisClient(tb testing.TB, r *servers.Redis) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(r.URL())
	if err != nil {
		tb.Fatalf("parse %s: %v", r.URL(), err)
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	tb.Cleanup(func() { c.Close() })
	return c
}

func TestRedisKillAndRestart(t *testing.T) {
	r := startRedis(t)
	c := redisClient(t, r)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v\n%s", err, r.LogTail(20))
	}
	if got, _ := c.ConfigGet(ctx, "save").Result(); got["save"] != "" {
		t.Errorf("CONFIG GET save = %q, want empty (no persistence)", got["save"])
	}
	port := r.Port()

	if err := r.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if r.Running() {
		t.Fatal("Running() after Kill = true")
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	if err := r.Kill(); err != nil {
		t.Errorf("second Kill = %v, want nil", err)
	}

	if err := r.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if r.Port() != port {
		t.Errorf("Port() after restart = %d, want %d", r.Port(), port)
	}
	n, err := c.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatalf("EXISTS after restart: %v", err)
	}
	if n != 0 {
		t.Error("key survived SIGKILL: Redis persisted data")
	}
	if err := r.Start(ctx); !errors.Is(err, servers.ErrRunning) {
		t.Errorf("Start on a running server = %v, want ErrRunning", err)
	}
}

func TestRedisClose(t *testing.T) {
	r := startRedis(t)
	c := redisClient(t, r)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Error("PING after Close succeeded")
	}
	if err := r.Start(context.Background()); !errors.Is(err, servers.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
}

// BenchmarkStartRedis measures a redis-server start.
func BenchmarkStartRedis(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		r, err := servers.StartRedis(ctx, servers.RedisOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
