package servers

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// RedisAdminUser is the ACL user that every node of a topology started by
// this package (StartRedisCluster, StartRedisSentinel, StartRedisTLS) has
// for the package's own use: readiness checks, cluster setup, replication
// (masteruser) and Sentinel's connections to the data nodes (auth-user).
// It has every permission and a random password; the topologies' Admin
// methods return it. It exists so that the users a test asks for, the
// default user included, can be as restricted as the test wants.
const RedisAdminUser = "walcount-test-admin"

// redisTopologyPollInterval is how often a topology is checked while
// waiting for it to converge (a cluster to form, a failover to finish).
// Each check talks to every node, so it runs less often than the readiness
// probe of a single process.
const redisTopologyPollInterval = 20 * time.Millisecond

// RedisUser is an ACL user of a Redis server.
type RedisUser struct {
	// Name is the user name. "default" redefines the default user, the one
	// that clients without AUTH use.
	Name string
	// Password is the user's password; "" means nopass (any password, or
	// none, is accepted).
	Password string
	// Rules are ACL rules as ACL SETUSER takes them, applied after "reset
	// on" and the password, e.g. {"~walcount:*", "+@all", "-@dangerous"}.
	// nil means full access: {"~*", "&*", "+@all"}.
	Rules []string
}

// aclArgs returns the arguments of the user's ACL directive: its name,
// then its rules.
func (u RedisUser) aclArgs() []string {
	args := []string{u.Name, "reset", "on"}
	if u.Password == "" {
		args = append(args, "nopass")
	} else {
		args = append(args, ">"+u.Password)
	}
	if u.Rules == nil {
		return append(args, "~*", "&*", "+@all")
	}
	return append(args, u.Rules...)
}

// userinfo returns the URL user info of u: name and password, or nil for
// the default user without a password.
func (u RedisUser) userinfo() *url.Userinfo {
	switch {
	case u.Name == "" && u.Password == "":
		return nil
	case u.Password == "":
		return url.User(u.Name)
	default:
		return url.UserPassword(u.Name, u.Password)
	}
}

// redisSecurity is what the options of every topology have in common: TLS
// and who may connect. It turns into config directives and into the access
// this package uses.
type redisSecurity struct {
	tls            *TLSFiles
	requireCert    bool
	users          []RedisUser
	password       string // of the default user
	disableDefault bool
	admin          RedisUser
	clientTLS      *tls.Config // for the package's own connections
}

// newRedisSecurity validates the security options and makes an admin
// password and the TLS client configuration.
func newRedisSecurity(files *TLSFiles, requireCert bool, users []RedisUser, password string, disableDefault bool) (*redisSecurity, error) {
	s := &redisSecurity{
		tls:            files,
		requireCert:    requireCert,
		users:          users,
		password:       password,
		disableDefault: disableDefault,
		admin:          RedisUser{Name: RedisAdminUser, Password: redisRandomToken()},
	}
	if password != "" && disableDefault {
		return nil, errors.New("both a default-user password and DisableDefaultUser given")
	}
	if requireCert && files == nil {
		return nil, errors.New("RequireClientCert without TLS files")
	}
	seen := map[string]bool{}
	for _, u := range users {
		switch {
		case u.Name == "" || strings.ContainsAny(u.Name, " \t\r\n\"'"):
			return nil, fmt.Errorf("invalid ACL user name %q", u.Name)
		case u.Name == RedisAdminUser:
			return nil, fmt.Errorf("ACL user %q is reserved for the package's own connections", u.Name)
		case u.Name == "default" && (password != "" || disableDefault):
			return nil, errors.New(`user "default" given together with a default-user password or DisableDefaultUser`)
		case seen[u.Name]:
			return nil, fmt.Errorf("ACL user %q given twice", u.Name)
		}
		seen[u.Name] = true
	}
	if files != nil {
		cfg, err := RedisTLSConfig(*files, true)
		if err != nil {
			return nil, err
		}
		s.clientTLS = cfg
	}
	return s, nil
}

// adminAccess is how the package connects to the data nodes.
func (s *redisSecurity) adminAccess() redisAccess {
	return redisAccess{tls: s.clientTLS, user: s.admin.Name, password: s.admin.Password}
}

// defaultUser returns the credentials of the default user as a RedisUser
// (empty Name: clients send AUTH with only a password, or none).
func (s *redisSecurity) defaultUser() RedisUser {
	return RedisUser{Password: s.password}
}

// appUser returns the user a topology's URL() uses: the first of the users
// asked for, or the default user.
func (s *redisSecurity) appUser() RedisUser {
	if len(s.users) > 0 {
		return s.users[0]
	}
	return s.defaultUser()
}

// addListen adds the port and TLS directives of a server on port.
func (s *redisSecurity) addListen(c *redisConf, port int) {
	if s.tls == nil {
		c.add("port", strconv.Itoa(port))
		return
	}
	c.add("port", "0")
	c.add("tls-port", strconv.Itoa(port))
	c.add("tls-cert-file", s.tls.ServerCert)
	c.add("tls-key-file", s.tls.ServerKey)
	c.add("tls-ca-cert-file", s.tls.CAFile)
	// The server certificate of MakeTLSFiles also allows client
	// authentication, so nodes present it when they connect to each other
	// (replication, the cluster bus, Sentinel).
	if s.requireCert {
		c.add("tls-auth-clients", "yes")
	} else {
		c.add("tls-auth-clients", "no")
	}
	c.add("tls-replication", "yes")
}

// addACL adds the ACL users of a data node and the credentials replicas use
// to authenticate to their master.
func (s *redisSecurity) addACL(c *redisConf) {
	c.add("user", s.admin.aclArgs()...)
	switch {
	case s.disableDefault:
		c.add("user", "default", "reset", "off")
	case s.password != "":
		c.add("user", RedisUser{Name: "default", Password: s.password}.aclArgs()...)
	}
	for _, u := range s.users {
		c.add("user", u.aclArgs()...)
	}
	c.add("masteruser", s.admin.Name)
	c.add("masterauth", s.admin.Password)
}

// RedisTLSConfig returns a client TLS configuration for servers that use
// files: it trusts only files.CAFile and verifies the server certificate
// against the IP address 127.0.0.1 (the certificate is also valid for
// "localhost"). With clientCert it presents files' client certificate,
// which servers started with RequireClientCert demand.
//
// A go-redis client takes it as Options.TLSConfig (ClusterOptions.TLSConfig,
// FailoverOptions.TLSConfig). By hand:
//
//	pem, _ := os.ReadFile(files.CAFile)
//	pool := x509.NewCertPool()
//	pool.AppendCertsFromPEM(pem)
//	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
//	// and, when the server requires client certificates:
//	cert, _ := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
//	cfg.Certificates = []tls.Certificate{cert}
func RedisTLSConfig(files TLSFiles, clientCert bool) (*tls.Config, error) {
	pem, err := os.ReadFile(files.CAFile)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in CA file %s", files.CAFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if clientCert {
		cert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// redisRandomToken returns 32 random hex digits, for passwords and ids.
func redisRandomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// redisConf accumulates the lines of a redis.conf.
type redisConf struct{ b strings.Builder }

// add appends the directive with its arguments, quoted where needed.
func (c *redisConf) add(directive string, args ...string) {
	c.b.WriteString(directive)
	for _, a := range args {
		c.b.WriteByte(' ')
		c.b.WriteString(quoteRedisArg(a))
	}
	c.b.WriteByte('\n')
}

func (c *redisConf) String() string { return c.b.String() }

// quoteRedisArg quotes a config argument the way redis-server's config
// parser (sdssplitargs) reads it back: bare when it is made only of
// characters that need no quoting, else in double quotes with \xHH escapes
// for quotes, backslashes and control characters.
func quoteRedisArg(s string) string {
	bare := s != ""
	for _, r := range s {
		if r <= ' ' || r == '"' || r == '\'' || r == '\\' || r >= 0x7f {
			bare = false
			break
		}
	}
	if bare {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch < ' ' || ch == '"' || ch == '\\' || ch >= 0x7f {
			fmt.Fprintf(&b, `\x%02x`, ch)
		} else {
			b.WriteByte(ch)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// addRedisDataDefaults adds what every data node (not a sentinel) has:
// persistence off and a replication that starts at once.
func addRedisDataDefaults(c *redisConf, dir string) {
	c.add("bind", "127.0.0.1")
	c.add("protected-mode", "no")
	c.add("daemonize", "no")
	c.add("logfile", "")
	c.add("dir", dir)
	c.add("save", "")
	c.add("appendonly", "no")
	// A replica writes the RDB its master sends into its directory; with
	// persistence off it would load that file again at its next start. This
	// deletes it once loaded, and removeRedisDumps covers a replica killed
	// before that.
	c.add("rdb-del-sync-files", "yes")
	// The default delay (5 s) waits for more replicas to share a diskless
	// transfer; tests want the replica attached at once.
	c.add("repl-diskless-sync", "yes")
	c.add("repl-diskless-sync-delay", "0")
}

// RedisNode is one redis-server process of a topology (a cluster node, a
// Sentinel-managed master or replica, a sentinel, or the single server of
// StartRedisTLS). The topology kills and restarts it; the node itself only
// tells where it is and what it logged. Its methods are safe for concurrent
// use.
type RedisNode struct {
	name     string // for logs and errors: "node2", "sentinel0", ...
	bin      string
	dir      string // the node's own directory
	logPath  string
	confPath string
	sentinel bool // run with --sentinel
	bus      bool // a cluster node, which needs a cluster bus port
	access   redisAccess
	logger   *zap.Logger
	// conf returns the config file for the ports. It is written before the
	// first start and whenever a port changes; otherwise the file stays as
	// the server left it, because sentinels rewrite their config with what
	// they learnt.
	conf func(port, busPort int) string
	// id is a cluster node's node id. StartRedisCluster sets it before it
	// returns the cluster; it never changes after that, so it is read
	// without mu.
	id string
	// port and busPort are read without mu, so that asking a node where
	// it is never waits for a start in progress.
	port    atomic.Int32
	busPort atomic.Int32

	mu       sync.Mutex
	confPort int // port the config file was written for; 0: none yet
	confBus  int
	proc     *process
	closed   bool
}

// newRedisNode makes the node's directory under root.
func newRedisNode(root, name, bin string, access redisAccess, logger *zap.Logger) (*RedisNode, error) {
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s directory: %w", name, err)
	}
	return &RedisNode{
		name:     name,
		bin:      bin,
		dir:      dir,
		logPath:  filepath.Join(dir, "redis.log"),
		confPath: filepath.Join(dir, "redis.conf"),
		access:   access,
		logger:   logger,
	}, nil
}

// Name returns the node's name within its topology, e.g. "node3".
func (n *RedisNode) Name() string { return n.name }

// Port returns the node's port on 127.0.0.1 (its TLS port with TLS).
func (n *RedisNode) Port() int { return int(n.port.Load()) }

// BusPort returns a cluster node's cluster bus port, 0 for other nodes.
func (n *RedisNode) BusPort() int { return int(n.busPort.Load()) }

// Addr returns 127.0.0.1:PORT.
func (n *RedisNode) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port()))
}

// ID returns a cluster node's node id, "" for other nodes.
func (n *RedisNode) ID() string { return n.id }

// Running reports whether the node's process runs.
func (n *RedisNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.running()
}

// PID returns the node's process id, or 0 while it is stopped.
func (n *RedisNode) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.pid()
}

// Dir returns the node's directory (config, log, nodes.conf).
func (n *RedisNode) Dir() string { return n.dir }

// LogPath returns the path of the node's log file.
func (n *RedisNode) LogPath() string { return n.logPath }

// LogTail returns the last lines of the node's log, for failure messages.
func (n *RedisNode) LogTail(lines int) string { return tailFile(n.logPath, lines) }

// start starts the stopped node and waits until it answers. A node that
// never ran picks free ports (again, when another process takes one
// first); a restarted node keeps its ports, which its peers know it by.
func (n *RedisNode) start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := startable(n.name, n.closed, n.proc); err != nil {
		return err
	}
	n.proc = nil
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	pick := n.Port() == 0
	began := time.Now()
	for attempt := 1; ; attempt++ {
		if pick {
			if err := n.pickPorts(); err != nil {
				return fmt.Errorf("start %s: %w", n.name, err)
			}
		}
		err := n.startOnce(ctx)
		if err == nil {
			break
		}
		if pick {
			releaseRedisPorts(n.Port(), n.BusPort())
			n.port.Store(0)
			n.busPort.Store(0)
		}
		if !pick || !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return fmt.Errorf("start %s: %w", n.name, err)
		}
		n.logger.Debug("redis port taken, retrying", zap.String("node", n.name))
	}
	n.logger.Info("redis node started", zap.String("node", n.name), zap.Int(logKeyPort, n.Port()),
		zap.Duration(logKeyTook, time.Since(began)))
	return nil
}

// reservedRedisPorts are the ports that nodes of this process hold or are
// about to bind. freePort closes its listener before it returns, so the
// kernel may hand the same port to two nodes that start at the same time;
// this set keeps them apart.
var reservedRedisPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// pickPorts picks free ports for the node: a data port, and a cluster bus
// port for a cluster node.
func (n *RedisNode) pickPorts() error {
	p, err := reserveRedisPort()
	if err != nil {
		return err
	}
	if n.bus {
		b, err := reserveRedisPort()
		if err != nil {
			releaseRedisPorts(p)
			return err
		}
		n.busPort.Store(int32(b))
	}
	n.port.Store(int32(p))
	return nil
}

// reserveRedisPort returns a free port that no other node of this process
// holds, and reserves it until releaseRedisPorts.
func reserveRedisPort() (int, error) {
	reservedRedisPorts.Lock()
	defer reservedRedisPorts.Unlock()
	for {
		p, err := freePort()
		if err != nil {
			return 0, err
		}
		if !reservedRedisPorts.m[p] {
			reservedRedisPorts.m[p] = true
			return p, nil
		}
	}
}

// releaseRedisPorts returns ports to the pool; 0 is ignored.
func releaseRedisPorts(ports ...int) {
	reservedRedisPorts.Lock()
	defer reservedRedisPorts.Unlock()
	for _, p := range ports {
		delete(reservedRedisPorts.m, p)
	}
}

// startOnce writes the config if the ports changed, runs the server and
// waits until it answers. The caller holds n.mu.
func (n *RedisNode) startOnce(ctx context.Context) error {
	port, bus := n.Port(), n.BusPort()
	if n.confPort != port || n.confBus != bus {
		if err := os.WriteFile(n.confPath, []byte(n.conf(port, bus)), 0o600); err != nil {
			return fmt.Errorf("write config: %w", err)
		}
		n.confPort, n.confBus = port, bus
	}
	if !n.sentinel {
		removeRedisDumps(n.dir)
	}
	logOffset := fileSize(n.logPath)
	args := []string{n.confPath}
	if n.sentinel {
		args = append(args, "--sentinel")
	}
	proc, err := startProcess(n.bin, args, n.dir, n.logPath, identity{}, syscall.SIGKILL)
	if err != nil {
		return err
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	pid := strconv.Itoa(proc.cmd.Process.Pid)
	for {
		// The process id tells this server from another one that holds
		// the port, which answers while this one fails to bind it.
		if info, err := redisDoString(ctx, addr, n.access, "INFO", "server"); err == nil &&
			parseRedisInfo(info)["process_id"] == pid {
			n.proc = proc
			return nil
		}
		select {
		case <-proc.done:
			out := readFrom(n.logPath, logOffset)
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("bind 127.0.0.1:%d: %w", port, errPortInUse)
			}
			return fmt.Errorf("redis-server exited during startup (%v); log:\n%s", proc.err, lastLines(out, 20))
		case <-ctx.Done():
			proc.killGroup()
			<-proc.done
			return fmt.Errorf("wait for %s on port %d: %w; log:\n%s",
				n.name, port, ctx.Err(), lastLines(readFrom(n.logPath, logOffset), 20))
		case <-ticker.C:
		}
	}
}

// removeRedisDumps deletes RDB files a replica received before it was
// killed, so that every start of a data node begins empty, as persistence
// off promises.
func removeRedisDumps(dir string) {
	matches, _ := filepath.Glob(filepath.Join(dir, "*.rdb"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
}

// kill kills the node with SIGKILL and waits until it has exited. Killing
// a stopped node does nothing.
func (n *RedisNode) kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fmt.Errorf("kill %s: %w", n.name, ErrClosed)
	}
	if n.proc == nil {
		return nil
	}
	if err := n.proc.signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", n.name, err)
	}
	<-n.proc.done
	n.proc = nil
	n.logger.Info("redis node killed", zap.String("node", n.name), zap.Int(logKeyPort, n.Port()))
	return nil
}

// close kills the node's process group for good. The topology removes the
// directories.
func (n *RedisNode) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.closed = true
	if n.proc != nil {
		n.proc.killGroup()
		<-n.proc.done
		n.proc = nil
	}
	releaseRedisPorts(n.Port(), n.BusPort())
}

// do runs one administrative command on the node.
func (n *RedisNode) do(ctx context.Context, args ...string) (any, error) {
	return redisDo(ctx, n.Addr(), n.access, args...)
}

// doString runs one administrative command whose reply is a string.
func (n *RedisNode) doString(ctx context.Context, args ...string) (string, error) {
	return redisDoString(ctx, n.Addr(), n.access, args...)
}

// info returns the fields of INFO section on the node.
func (n *RedisNode) info(ctx context.Context, section string) (map[string]string, error) {
	s, err := n.doString(ctx, "INFO", section)
	if err != nil {
		return nil, err
	}
	return parseRedisInfo(s), nil
}

// startRedisNodes starts the nodes in parallel and returns the first error.
func startRedisNodes(ctx context.Context, nodes []*RedisNode) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.start(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// prepareRedis is what a start of TLS, cluster or sentinel servers needs
// first: the redis-server binary, the nodes' security (newRedisSecurity's
// arguments) and a fresh directory named from prefix for them.
func prepareRedis(prefix string, files *TLSFiles, requireCert bool, users []RedisUser, password string, disableDefault bool) (bin string, sec *redisSecurity, root string, err error) {
	if bin, err = findRedisBin(); err != nil {
		return "", nil, "", err
	}
	if sec, err = newRedisSecurity(files, requireCert, users, password, disableDefault); err != nil {
		return "", nil, "", err
	}
	if root, err = makeTempDir(prefix); err != nil {
		return "", nil, "", err
	}
	return bin, sec, root, nil
}

// closeFailedStart, deferred by a start of several nodes, kills the nodes
// and removes root when the start failed (*err is not nil), and adds the
// tails of the nodes' logs to *err.
func closeFailedStart(err *error, nodes func() []*RedisNode, root string) {
	if *err == nil {
		return
	}
	if tails := redisLogTails(nodes(), 15); tails != "" {
		*err = fmt.Errorf("%w\n%s", *err, tails)
	}
	_ = closeRedisNodes(nodes(), root)
}

// closeRedisNodes kills every node and removes root.
func closeRedisNodes(nodes []*RedisNode, root string) error {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(n.close)
	}
	wg.Wait()
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("remove %s: %w", root, err)
	}
	return nil
}

// redisLogTails returns the last lines of every node's log, each under a
// header naming the node, for failure messages.
func redisLogTails(nodes []*RedisNode, lines int) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "--- %s (%s) log, last %d lines:\n%s\n", n.name, n.Addr(), lines, n.LogTail(lines))
	}
	return b.String()
}

// waitRedis polls check every redisTopologyPollInterval until it reports done,
// returns an error, or ctx ends. check's status says what is still missing;
// the last one goes into the timeout error.
func waitRedis(ctx context.Context, what string, check func(ctx context.Context) (done bool, status string, err error)) error {
	ticker := time.NewTicker(redisTopologyPollInterval)
	defer ticker.Stop()
	var status string
	for {
		done, st, err := check(ctx)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if done {
			return nil
		}
		status = st
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (last state: %s)", what, ctx.Err(), status)
		case <-ticker.C:
		}
	}
}
