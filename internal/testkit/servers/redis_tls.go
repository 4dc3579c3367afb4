package servers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"sync"

	"go.uber.org/zap"
)

// RedisTLSOptions configures StartRedisTLS. TLS is required.
type RedisTLSOptions struct {
	// TLS are the server's certificate, key and CA, e.g. from MakeTLSFiles.
	TLS TLSFiles
	// RequireClientCert makes the server demand a client certificate
	// signed by the CA (tls-auth-clients yes); otherwise it asks for none
	// (tls-auth-clients no).
	RequireClientCert bool
	// Users are ACL users. See RedisUser; a user named "default" redefines
	// the default user, e.g. {Name: "default", Rules: []string{"off"}}
	// turns it off.
	Users []RedisUser
	// Password, when set, protects the default user with it.
	Password string
	// DisableDefaultUser turns the default user off: clients must log in
	// as one of Users.
	DisableDefaultUser bool
	// Port is the TLS port on 127.0.0.1. 0 means a random free port.
	Port int
	// Logger receives start and kill events. nil means no logging.
	Logger *zap.Logger
}

// RedisTLS is a TLS-only redis-server (port 0, tls-port) with ACL users,
// started by StartRedisTLS, with persistence off. Its methods are safe for
// concurrent use.
//
// Clients need the CA: a go-redis client takes
// RedisTLSConfig(r.TLS(), clientCert) as Options.TLSConfig, whose RootCAs
// hold only the CA and whose ServerName is 127.0.0.1 (the certificate is
// valid for 127.0.0.1, ::1 and localhost). redis.ParseURL(r.URL()) sets a
// TLSConfig with only a ServerName; replace it, or set its RootCAs (and
// Certificates when the server requires client certificates).
type RedisTLS struct {
	node *RedisNode
	root string
	sec  *redisSecurity

	mu     sync.Mutex
	closed bool
}

// StartRedisTLS starts a TLS-only redis-server on 127.0.0.1 and waits
// until it answers. ctx bounds the start; with no deadline,
// DefaultStartTimeout applies.
func StartRedisTLS(ctx context.Context, opt RedisTLSOptions) (_ *RedisTLS, err error) {
	if opt.TLS.CAFile == "" || opt.TLS.ServerCert == "" || opt.TLS.ServerKey == "" {
		return nil, errors.New("start redis tls: RedisTLSOptions.TLS needs a CA, a server certificate and its key (see MakeTLSFiles)")
	}
	files := opt.TLS
	bin, sec, root, err := prepareRedis("walcount-redis-tls-", &files, opt.RequireClientCert, opt.Users, opt.Password, opt.DisableDefaultUser)
	if err != nil {
		return nil, fmt.Errorf("start redis tls: %w", err)
	}
	logger := opt.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	n, err := newRedisNode(root, "redis", bin, sec.adminAccess(), logger)
	if err != nil {
		_ = closeRedisNodes(nil, root)
		return nil, fmt.Errorf("start redis tls: %w", err)
	}
	n.port.Store(int32(opt.Port))
	n.conf = func(port, _ int) string {
		var c redisConf
		addRedisDataDefaults(&c, n.dir)
		sec.addListen(&c, port)
		sec.addACL(&c)
		return c.String()
	}
	r := &RedisTLS{node: n, root: root, sec: sec}
	if err := n.start(ctx); err != nil {
		_ = closeRedisNodes([]*RedisNode{n}, root)
		return nil, fmt.Errorf("start redis tls: %w", err)
	}
	return r, nil
}

// Start starts the stopped (killed) server again on the same port and
// waits until it answers. It comes back empty: nothing is persisted.
func (r *RedisTLS) Start(ctx context.Context) error {
	if r.isClosed() {
		return fmt.Errorf("start redis tls: %w", ErrClosed)
	}
	return r.node.start(ctx)
}

// Kill kills the server with SIGKILL, losing everything it held, and waits
// until it has exited. Killing a stopped server returns nil.
func (r *RedisTLS) Kill() error {
	if r.isClosed() {
		return fmt.Errorf("kill redis tls: %w", ErrClosed)
	}
	return r.node.kill()
}

func (r *RedisTLS) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Close kills the server and removes its directory. It is idempotent.
func (r *RedisTLS) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	if err := closeRedisNodes([]*RedisNode{r.node}, r.root); err != nil {
		return fmt.Errorf("close redis tls: %w", err)
	}
	return nil
}

// Running reports whether the server is running.
func (r *RedisTLS) Running() bool { return r.node.Running() }

// PID returns the server's process id, or 0 while it is stopped.
func (r *RedisTLS) PID() int { return r.node.PID() }

// Port returns the server's TLS port.
func (r *RedisTLS) Port() int { return r.node.Port() }

// Addr returns the server's address, 127.0.0.1:PORT.
func (r *RedisTLS) Addr() string { return r.node.Addr() }

// URL returns rediss://[USER:PASSWORD@]127.0.0.1:PORT/0 with the
// credentials of the first of the options' Users, or of the default user
// when there are none. The CA is not part of the URL; see RedisTLS.
func (r *RedisTLS) URL() string { return r.URLFor(r.sec.appUser()) }

// URLFor is URL with the credentials of u.
func (r *RedisTLS) URLFor(u RedisUser) string {
	return (&url.URL{Scheme: "rediss", User: u.userinfo(), Host: r.Addr(), Path: "/0"}).String()
}

// TLS returns the server's TLS files.
func (r *RedisTLS) TLS() TLSFiles { return *r.sec.tls }

// ClientTLSConfig returns RedisTLSConfig(r.TLS(), clientCert): the client
// TLS configuration that trusts the server.
func (r *RedisTLS) ClientTLSConfig(clientCert bool) (*tls.Config, error) {
	return RedisTLSConfig(*r.sec.tls, clientCert)
}

// Admin returns the credentials of RedisAdminUser on this server.
func (r *RedisTLS) Admin() RedisUser { return r.sec.admin }

// LogTail returns the last n lines of the server log, for failure messages.
func (r *RedisTLS) LogTail(n int) string { return r.node.LogTail(n) }

// LogPath returns the path of the server's log file.
func (r *RedisTLS) LogPath() string { return r.node.LogPath() }

// Dir returns the server's directory.
func (r *RedisTLS) Dir() string { return r.root }
