package servers_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// limitedUser may only touch walcount's keys, with the hash, key-space and
// connection commands.
var limitedUser = servers.RedisUser{
	Name:     "walcount",
	Password: "s3cret",
	Rules:    []string{"~walcount:*", "+@hash", "+@keyspace", "+@connection", "-@dangerous"},
}

// startRedisTLS starts a TLS server that the test's cleanup closes.
func startRedisTLS(tb testing.TB, opt servers.RedisTLSOptions) *servers.RedisTLS {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := servers.StartRedisTLS(ctx, opt)
	if err != nil {
		tb.Fatalf("StartRedisTLS: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("redis log:\n%s", r.LogTail(30))
		}
		if err := r.Close(); err != nil {
			tb.Errorf("close redis: %v", err)
		}
	})
	return r
}

// tlsClient opens a client for URL u with tlsConfig, closed by the test's
// cleanup. Retries are off, so that an error is the server's first answer.
func tlsClient(tb testing.TB, u string, tlsConfig *tls.Config) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(u)
	if err != nil {
		tb.Fatalf("parse %s: %v", u, err)
	}
	opt.TLSConfig = tlsConfig
	opt.MaxRetries = -1
	opt.DialTimeout = 5 * time.Second
	c := redis.NewClient(opt)
	tb.Cleanup(func() { c.Close() })
	return c
}

func TestRedisTLSAndACL(t *testing.T) {
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	r := startRedisTLS(t, servers.RedisTLSOptions{
		TLS:                files,
		Users:              []servers.RedisUser{limitedUser},
		DisableDefaultUser: true,
	})
	if want := "rediss://walcount:s3cret@" + r.Addr() + "/0"; r.URL() != want {
		t.Errorf("URL() = %q, want %q", r.URL(), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	trusting, err := r.ClientTLSConfig(false)
	if err != nil {
		t.Fatal(err)
	}

	c := tlsClient(t, r.URL(), trusting)
	if err := c.HSet(ctx, metaKey, "gen", 1).Err(); err != nil {
		t.Fatalf("HSET %s as %s: %v", metaKey, limitedUser.Name, err)
	}
	if err := c.HSet(ctx, "other", "gen", 1).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Errorf("HSET other as %s = %v, want NOPERM", limitedUser.Name, err)
	}
	if err := c.FlushAll(ctx).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Errorf("FLUSHALL as %s = %v, want NOPERM", limitedUser.Name, err)
	}

	anonymous := tlsClient(t, r.URLFor(servers.RedisUser{}), trusting)
	if err := anonymous.HSet(ctx, metaKey, "gen", 1).Err(); err == nil {
		t.Error("HSET as the disabled default user succeeded")
	}

	// A client that trusts only the system's CAs must reject the server.
	untrusting := tlsClient(t, r.URL(), &tls.Config{ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	err = untrusting.Ping(ctx).Err()
	var unknownCA x509.UnknownAuthorityError
	if !errors.As(err, &unknownCA) {
		t.Errorf("PING without the CA = %v, want x509.UnknownAuthorityError", err)
	}

	// There is no plain-text port: a plain client gets no answer.
	plain := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: limitedUser.Name, Password: limitedUser.Password,
		MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Error("PING over plain TCP to the TLS port succeeded")
	}
}

func TestRedisTLSRequireClientCert(t *testing.T) {
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	r := startRedisTLS(t, servers.RedisTLSOptions{TLS: files, RequireClientCert: true, Password: "pw"})
	if want := "rediss://:pw@" + r.Addr() + "/0"; r.URL() != want {
		t.Errorf("URL() = %q, want %q", r.URL(), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	withCert, err := r.ClientTLSConfig(true)
	if err != nil {
		t.Fatal(err)
	}
	withoutCert, err := r.ClientTLSConfig(false)
	if err != nil {
		t.Fatal(err)
	}
	if err := tlsClient(t, r.URL(), withCert).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING with a client certificate: %v", err)
	}
	// With TLS 1.3 the server rejects the missing certificate after the
	// client's side of the handshake is done, so the error may surface on
	// the first read rather than in the handshake.
	if err := tlsClient(t, r.URL(), withoutCert).Ping(ctx).Err(); err == nil {
		t.Error("PING without a client certificate succeeded")
	}
	if err := tlsClient(t, r.URLFor(servers.RedisUser{Password: "wrong"}), withCert).Ping(ctx).Err(); err == nil ||
		!strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("PING with a wrong password = %v, want WRONGPASS", err)
	}
}

func TestRedisTLSKillAndStart(t *testing.T) {
	// testenv's helper makes the certificates and starts the server; this
	// test covers the helper too.
	r := testenv.RedisTLS(t, limitedUser)
	cfg, err := r.ClientTLSConfig(false)
	if err != nil {
		t.Fatal(err)
	}
	// The same client must carry on after the restart. go-redis cannot
	// tell that a pooled TLS connection died with the server until it uses
	// it, so this client keeps its default retries.
	opt, err := redis.ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.TLSConfig = cfg
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.HSet(ctx, metaKey, "gen", 1).Err(); err != nil {
		t.Fatal(err)
	}
	port := r.Port()
	if err := r.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if r.Running() || r.PID() != 0 {
		t.Fatal("server runs after Kill")
	}
	if conn, err := net.DialTimeout("tcp", r.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatal("port still accepts connections after Kill")
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if r.Port() != port {
		t.Errorf("Port() after restart = %d, want %d", r.Port(), port)
	}
	n, err := c.Exists(ctx, metaKey).Result()
	if err != nil {
		t.Fatalf("EXISTS after restart: %v", err)
	}
	if n != 0 {
		t.Error("key survived SIGKILL: the server persisted data")
	}
	if err := r.Start(ctx); !errors.Is(err, servers.ErrRunning) {
		t.Errorf("Start on a running server = %v, want ErrRunning", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := r.Start(ctx); !errors.Is(err, servers.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
}
