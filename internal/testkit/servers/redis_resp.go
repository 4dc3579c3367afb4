package servers

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
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

// redisReplyError is an error reply (-ERR ..., -NOPERM ...) of a server.
type redisReplyError string

func (e redisReplyError) Error() string { return string(e) }

// redisConn is a minimal RESP2 client for the package's own administrative
// commands. go-redis is not used for them because its pools, retries and
// background goroutines would hide exactly the failures that readiness
// polling has to see, and a topology is polled against nodes that come and
// go.
type redisConn struct {
	c net.Conn
	r *bufio.Reader
}

// dialRedis connects to addr, performs the TLS handshake when a.tls is set,
// and authenticates when a.password is set. The connection's deadline is
// the earlier of ctx's deadline and redisCommandTimeout from now; do resets
// it for every command.
func dialRedis(ctx context.Context, addr string, a redisAccess) (*redisConn, error) {
	ctx, cancel := context.WithTimeout(ctx, redisCommandTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := raw
	if a.tls != nil {
		tc := tls.Client(raw, a.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
		}
		c = tc
	}
	rc := &redisConn{c: c, r: bufio.NewReader(c)}
	if a.password != "" {
		args := []string{"AUTH", a.password}
		if a.user != "" {
			args = []string{"AUTH", a.user, a.password}
		}
		if _, err := rc.do(ctx, args...); err != nil {
			rc.Close()
			return nil, fmt.Errorf("auth on %s: %w", addr, err)
		}
	}
	return rc, nil
}

// Close closes the connection.
func (c *redisConn) Close() error { return c.c.Close() }

// do sends one command and reads its reply. An error reply is returned as
// a redisReplyError; nil replies are returned as nil.
func (c *redisConn) do(ctx context.Context, args ...string) (any, error) {
	deadline := time.Now().Add(redisCommandTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.c, b.String()); err != nil {
		return nil, err
	}
	v, err := readRedisReply(c.r)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(redisReplyError); ok {
		return nil, e
	}
	return v, nil
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

// maxRedisBulk bounds a bulk string this client accepts; administrative
// replies are small, and a garbled length must not allocate gigabytes.
const maxRedisBulk = 64 << 20

// readRedisReply reads one RESP2 value: a string for simple and bulk
// strings, int64 for integers, []any for arrays, nil for nil replies and a
// redisReplyError for errors (nested ones included).
func readRedisReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("resp: empty line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return redisReplyError(body), nil
	case ':':
		n, err := strconv.ParseInt(body, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("resp: bad integer %q", body)
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxRedisBulk {
			return nil, fmt.Errorf("resp: bad bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxRedisBulk {
			return nil, fmt.Errorf("resp: bad array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readRedisReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	default:
		return nil, fmt.Errorf("resp: unexpected reply type %q", line[0])
	}
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
