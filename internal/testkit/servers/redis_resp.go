package servers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisCommandTimeout bounds one administrative command (dial, handshake,
// AUTH and the command itself) when the caller's context allows longer: a
// node that does not answer within it is treated as down for this round of
// polling, and the caller polls again.
const redisCommandTimeout = 2 * time.Second

// redisAccess says how this package reaches a server for its own
// administrative commands: over TLS or not, and as which user.
type redisAccess struct {
	tls      *tls.Config // nil: plain TCP
	user     string      // "" with a password: AUTH password (the default user)
	password string      // "": no AUTH
}

// redisConn is one connection for the package's own administrative
// commands: a go-redis client with a single connection, no retries and
// RESP2, so that readiness polling sees every failure of a node that comes
// and goes instead of a retry hiding it. The connection is dialled here
// and handed to go-redis, so that a node that is down fails the dial
// quietly: go-redis's own dials write every failure to its process-wide
// logger, which the daemon's tests route (internal/redisconn).
type redisConn struct {
	c *redis.Client
}

// errRedisConnUsed is what go-redis gets if it dials a second time (the
// handed-over connection broke): the caller dials again.
var errRedisConnUsed = errors.New("administrative connection already used")

// dialRedis connects to addr, performs the TLS handshake when a.tls is set,
// and authenticates when a.password is set. Every command, the dial
// included, is bounded by the earlier of ctx's deadline and
// redisCommandTimeout.
func dialRedis(ctx context.Context, addr string, a redisAccess) (*redisConn, error) {
	ctx, cancel := context.WithTimeout(ctx, redisCommandTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if a.tls != nil {
		tc := tls.Client(conn, a.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
		}
		conn = tc
	}
	var once sync.Once
	c := redis.NewClient(&redis.Options{
		Addr: addr,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			err := errRedisConnUsed
			once.Do(func() { err = nil })
			if err != nil {
				return nil, err
			}
			return conn, nil
		},
		Username:              a.user,
		Password:              a.password,
		Protocol:              2,
		DisableIdentity:       true,
		MaxRetries:            -1,
		DialerRetries:         1,
		PoolSize:              1,
		ReadTimeout:           redisCommandTimeout,
		WriteTimeout:          redisCommandTimeout,
		ContextTimeoutEnabled: true,
	})
	// AUTH now, so that its failure is the dial's.
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return &redisConn{c: c}, nil
}

// Close closes the connection.
func (c *redisConn) Close() error { return c.c.Close() }

// do sends one command and reads its reply: a string for simple and bulk
// strings, int64 for integers, []any for arrays, nil for nil replies. An
// error reply is returned as an error.
func (c *redisConn) do(ctx context.Context, args ...string) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, redisCommandTimeout)
	defer cancel()
	a := make([]any, len(args))
	for i, s := range args {
		a[i] = s
	}
	v, err := c.c.Do(ctx, a...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

// doString runs a command whose reply is a string (simple or bulk).
func (c *redisConn) doString(ctx context.Context, args ...string) (string, error) {
	v, err := c.do(ctx, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: unexpected reply %T", args[0], v)
	}
	return s, nil
}

// redisDo dials addr, runs one command and closes the connection.
func redisDo(ctx context.Context, addr string, a redisAccess, args ...string) (any, error) {
	c, err := dialRedis(ctx, addr, a)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.do(ctx, args...)
}

// redisDoString is redisDo for a command whose reply is a string.
func redisDoString(ctx context.Context, addr string, a redisAccess, args ...string) (string, error) {
	c, err := dialRedis(ctx, addr, a)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.doString(ctx, args...)
}

// parseRedisInfo turns the text of INFO into a map of its fields.
func parseRedisInfo(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// redisFieldMap turns a flat [name, value, name, value, ...] reply, as
// SENTINEL MASTER and SENTINEL REPLICAS give, into a map.
func redisFieldMap(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		val, _ := a[i+1].(string)
		m[k] = val
	}
	return m
}
