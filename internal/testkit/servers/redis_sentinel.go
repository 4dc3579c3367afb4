package servers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Defaults of RedisSentinelOptions.
const (
	// DefaultRedisSentinelMasterName is the name the sentinels monitor the
	// master under.
	DefaultRedisSentinelMasterName = "walcount"
	// DefaultRedisSentinelDownAfter is down-after-milliseconds: how long
	// the master must not answer before a sentinel considers it down.
	DefaultRedisSentinelDownAfter = time.Second
	// DefaultRedisSentinelFailoverTimeout is failover-timeout. It bounds a
	// failover's steps, and a sentinel whose failover attempt failed (a
	// split vote) waits twice as long before it tries again, so it is kept
	// short.
	DefaultRedisSentinelFailoverTimeout = 2 * time.Second
)

// RedisSentinelOptions configures StartRedisSentinel. The zero value is a
// master without replicas watched by three sentinels.
type RedisSentinelOptions struct {
	// MasterName is the name the sentinels know the master by. "" means
	// DefaultRedisSentinelMasterName.
	MasterName string
	// Replicas is the number of replicas of the master. A failover needs
	// at least one.
	Replicas int
	// Sentinels is the number of sentinels. 0 means 3.
	Sentinels int
	// Quorum is the number of sentinels that must agree that the master is
	// down. 0 means a majority of Sentinels.
	Quorum int
	// DownAfter is down-after-milliseconds. 0 means
	// DefaultRedisSentinelDownAfter.
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout. 0 means
	// DefaultRedisSentinelFailoverTimeout.
	FailoverTimeout time.Duration
	// TLS, when set, makes every process TLS-only (port 0, tls-port), the
	// sentinels and replication included, with these files.
	TLS *TLSFiles
	// RequireClientCert makes every process demand a client certificate
	// signed by the CA (tls-auth-clients yes). It needs TLS.
	RequireClientCert bool
	// Users are ACL users on the master and the replicas. See RedisUser.
	Users []RedisUser
	// Password, when set, protects the default user of the master and the
	// replicas with it.
	Password string
	// DisableDefaultUser turns the default user of the master and the
	// replicas off.
	DisableDefaultUser bool
	// SentinelPassword, when set, is the sentinels' requirepass: clients
	// must AUTH with it to ask a sentinel anything.
	SentinelPassword string
	// Logger receives start and kill events. nil means no logging.
	Logger *zap.Logger
}

// RedisSentinel is a master, its replicas and the sentinels that watch
// them, all redis-server processes on 127.0.0.1 started by
// StartRedisSentinel, each in its own directory. The master and the
// replicas have persistence off. Its methods are safe for concurrent use.
type RedisSentinel struct {
	root       string
	masterName string
	data       []*RedisNode // data[0] is the first master
	sentinels  []*RedisNode
	sec        *redisSecurity
	sentPass   string
	logger     *zap.Logger

	mu     sync.Mutex
	closed bool
}

// StartRedisSentinel starts the master, then its replicas (replicaof the
// master) in parallel, waits until every replica is in sync, and then
// starts the sentinels in parallel. It waits until every sentinel sees the
// master as up, its replicas as in sync, and every other sentinel as
// reachable. ctx bounds the start; with no deadline, DefaultStartTimeout
// applies.
//
// Each sentinel has its own writable config file, which it rewrites with
// what it learns. The files start out with what the sentinels would
// otherwise discover over a few seconds of hello messages: each sentinel's
// id (sentinel myid), the other sentinels (known-sentinel) and the
// replicas (known-replica). The sentinels connect to the master and the
// replicas as RedisAdminUser (sentinel auth-user and auth-pass), whatever
// the options do to the default user.
//
// A start takes about 1.2 s: the sentinels that start first find the
// others not yet listening, and a sentinel retries a link only once a
// second.
func StartRedisSentinel(ctx context.Context, opt RedisSentinelOptions) (_ *RedisSentinel, err error) {
	if opt.MasterName == "" {
		opt.MasterName = DefaultRedisSentinelMasterName
	}
	if opt.Sentinels == 0 {
		opt.Sentinels = 3
	}
	if opt.Quorum == 0 {
		opt.Quorum = opt.Sentinels/2 + 1
	}
	if opt.DownAfter == 0 {
		opt.DownAfter = DefaultRedisSentinelDownAfter
	}
	if opt.FailoverTimeout == 0 {
		opt.FailoverTimeout = DefaultRedisSentinelFailoverTimeout
	}
	switch {
	case opt.Replicas < 0 || opt.Sentinels < 0:
		return nil, fmt.Errorf("start redis sentinel: invalid size: %d replicas, %d sentinels", opt.Replicas, opt.Sentinels)
	case opt.Quorum < 1 || opt.Quorum > opt.Sentinels:
		return nil, fmt.Errorf("start redis sentinel: quorum %d out of range 1..%d", opt.Quorum, opt.Sentinels)
	case strings.ContainsAny(opt.MasterName, " \t\r\n\"'/"):
		return nil, fmt.Errorf("start redis sentinel: invalid master name %q", opt.MasterName)
	}
	bin, sec, root, err := prepareRedis("walcount-redis-sentinel-", opt.TLS, opt.RequireClientCert, opt.Users, opt.Password, opt.DisableDefaultUser)
	if err != nil {
		return nil, fmt.Errorf("start redis sentinel: %w", err)
	}
	s := &RedisSentinel{root: root, masterName: opt.MasterName, sec: sec, sentPass: opt.SentinelPassword, logger: opt.Logger}
	if s.logger == nil {
		s.logger = zap.NewNop()
	}
	defer closeFailedStart(&err, s.all, root)
	for i := range 1 + opt.Replicas {
		n, err := newRedisNode(root, "redis"+strconv.Itoa(i), bin, sec.adminAccess(), s.logger)
		if err != nil {
			return nil, fmt.Errorf("start redis sentinel: %w", err)
		}
		s.data = append(s.data, n)
	}
	sentAccess := redisAccess{tls: sec.clientTLS, password: opt.SentinelPassword}
	for i := range opt.Sentinels {
		n, err := newRedisNode(root, "sentinel"+strconv.Itoa(i), bin, sentAccess, s.logger)
		if err != nil {
			return nil, fmt.Errorf("start redis sentinel: %w", err)
		}
		n.sentinel = true
		s.sentinels = append(s.sentinels, n)
	}

	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	began := time.Now()
	master := s.data[0]
	master.conf = sentinelDataConf(master.dir, sec, 0)
	if err := master.start(ctx); err != nil {
		return nil, fmt.Errorf("start redis sentinel: %w", err)
	}
	for _, n := range s.data[1:] {
		n.conf = sentinelDataConf(n.dir, sec, master.Port())
	}
	if err := startRedisNodes(ctx, s.data[1:]); err != nil {
		return nil, fmt.Errorf("start redis sentinel: %w", err)
	}
	// A sentinel takes the replicas' state from their INFO, which it asks
	// for only every ten seconds while the master is up: replicas that
	// were still syncing at its first look would hold the wait below up
	// for that long.
	if err := waitRedis(ctx, "the replicas to sync", func(ctx context.Context) (bool, string, error) {
		for _, n := range s.data[1:] {
			info, err := n.info(ctx, "replication")
			if err != nil {
				return false, fmt.Sprintf("%s: %v", n.name, err), nil
			}
			if st := info["master_link_status"]; st != "up" {
				return false, fmt.Sprintf("%s: master_link_status:%s", n.name, st), nil
			}
		}
		return true, "", nil
	}); err != nil {
		return nil, fmt.Errorf("start redis sentinel: %w", err)
	}
	if err := s.startSentinels(ctx, opt); err != nil {
		return nil, fmt.Errorf("start redis sentinel: %w", err)
	}
	if err := s.WaitHealthy(ctx); err != nil {
		return nil, fmt.Errorf("start redis sentinel: %w", err)
	}
	s.logger.Info("redis sentinel started", zap.Int("replicas", opt.Replicas),
		zap.Int("sentinels", opt.Sentinels), zap.Duration(logKeyTook, time.Since(began)))
	return s, nil
}

// sentinelDataConf returns the config function of a data node in dir: a
// replica of the master on masterPort, or a master when it is 0.
func sentinelDataConf(dir string, sec *redisSecurity, masterPort int) func(port, busPort int) string {
	return func(port, _ int) string {
		var c redisConf
		addRedisDataDefaults(&c, dir)
		sec.addListen(&c, port)
		sec.addACL(&c)
		if masterPort != 0 {
			c.add("replicaof", "127.0.0.1", strconv.Itoa(masterPort))
		}
		return c.String()
	}
}

// startSentinels picks every sentinel's port and id first, because each
// sentinel's config names all the others, then starts them in parallel.
// When another process takes one of the ports first, all sentinels are
// stopped and started again on new ports with fresh configs.
func (s *RedisSentinel) startSentinels(ctx context.Context, opt RedisSentinelOptions) error {
	for attempt := 1; ; attempt++ {
		ids := make([]string, len(s.sentinels))
		ports := make([]int, len(s.sentinels))
		for i, n := range s.sentinels {
			p, err := reserveRedisPort()
			if err != nil {
				return err
			}
			n.port.Store(int32(p))
			n.mu.Lock()
			n.confPort = 0
			n.mu.Unlock()
			ids[i], ports[i] = redisSentinelID(), p
		}
		// The config functions run under their own node's lock, so they
		// get the ports as values rather than asking the other nodes.
		replicaPorts := make([]int, 0, len(s.data)-1)
		for _, r := range s.data[1:] {
			replicaPorts = append(replicaPorts, r.Port())
		}
		for i, n := range s.sentinels {
			n.conf = s.sentinelConf(n.dir, i, ids, ports, s.data[0].Port(), replicaPorts, opt)
		}
		err := startRedisNodes(ctx, s.sentinels)
		if err == nil {
			return nil
		}
		for _, n := range s.sentinels {
			_ = n.kill()
			releaseRedisPorts(n.Port())
			n.port.Store(0)
			n.mu.Lock()
			n.confPort = 0
			n.mu.Unlock()
		}
		if !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return err
		}
		s.logger.Debug("sentinel port taken, retrying")
	}
}

// redisSentinelID returns a random sentinel run id: 40 hex digits.
func redisSentinelID() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sentinelConf returns the config function of sentinel i. ids and ports
// are those of all sentinels; the master and the replicas listen on
// masterPort and replicaPorts.
func (s *RedisSentinel) sentinelConf(dir string, i int, ids []string, ports []int, masterPort int, replicaPorts []int,
	opt RedisSentinelOptions) func(port, busPort int) string {
	return func(port, _ int) string {
		var c redisConf
		c.add("bind", "127.0.0.1")
		c.add("protected-mode", "no")
		c.add("daemonize", "no")
		c.add("logfile", "")
		c.add("dir", dir)
		s.sec.addListen(&c, port)
		if opt.SentinelPassword != "" {
			c.add("requirepass", opt.SentinelPassword)
			// Sentinels authenticate to each other with sentinel-pass.
			c.add("sentinel", "sentinel-pass", opt.SentinelPassword)
		}
		c.add("sentinel", "myid", ids[i])
		// The sentinels tell each other where they are in hello messages;
		// explicit values keep a TLS-only sentinel from announcing port 0.
		c.add("sentinel", "announce-ip", "127.0.0.1")
		c.add("sentinel", "announce-port", strconv.Itoa(port))
		name := s.masterName
		c.add("sentinel", "monitor", name, "127.0.0.1", strconv.Itoa(masterPort), strconv.Itoa(opt.Quorum))
		c.add("sentinel", "down-after-milliseconds", name, strconv.FormatInt(opt.DownAfter.Milliseconds(), 10))
		c.add("sentinel", "failover-timeout", name, strconv.FormatInt(opt.FailoverTimeout.Milliseconds(), 10))
		c.add("sentinel", "parallel-syncs", name, "1")
		c.add("sentinel", "auth-user", name, s.sec.admin.Name)
		c.add("sentinel", "auth-pass", name, s.sec.admin.Password)
		for _, p := range replicaPorts {
			c.add("sentinel", "known-replica", name, "127.0.0.1", strconv.Itoa(p))
		}
		for j := range ports {
			if j != i {
				c.add("sentinel", "known-sentinel", name, "127.0.0.1", strconv.Itoa(ports[j]), ids[j])
			}
		}
		return c.String()
	}
}

// all returns the data nodes and the sentinels.
func (s *RedisSentinel) all() []*RedisNode {
	return append(slices.Clone(s.data), s.sentinels...)
}

// runningRedisNodes returns the nodes of list whose process runs.
func runningRedisNodes(list []*RedisNode) []*RedisNode {
	var out []*RedisNode
	for _, n := range list {
		if n.Running() {
			out = append(out, n)
		}
	}
	return out
}

// healthy checks once that every running sentinel reports the master as
// up with all running replicas in sync, and all other running sentinels
// as reachable, and that they agree on the master.
func (s *RedisSentinel) healthy(ctx context.Context) (string, error) {
	sentinels := runningRedisNodes(s.sentinels)
	if len(sentinels) == 0 {
		return "no sentinel is running", nil
	}
	replicas := 0
	for _, n := range s.data {
		if n.Running() {
			replicas++
		}
	}
	replicas-- // one of them is the master
	var masterAddr string
	for _, sn := range sentinels {
		conn, err := dialRedis(ctx, sn.Addr(), sn.access)
		if err != nil {
			return fmt.Sprintf("%s: %v", sn.name, err), nil
		}
		status, addr, err := s.sentinelView(ctx, conn, replicas, len(sentinels)-1)
		conn.Close()
		if err != nil {
			return fmt.Sprintf("%s: %v", sn.name, err), nil
		}
		if status != "" {
			return sn.name + ": " + status, nil
		}
		if masterAddr == "" {
			masterAddr = addr
		} else if addr != masterAddr {
			return fmt.Sprintf("sentinels disagree on the master: %s vs %s", masterAddr, addr), nil
		}
	}
	return "", nil
}

// sentinelView checks what one sentinel says: "" when it sees the master
// up, wantReplicas replicas in sync and wantPeers reachable sentinels; a
// description of what is missing otherwise. It returns the master's
// address.
func (s *RedisSentinel) sentinelView(ctx context.Context, conn *redisConn, wantReplicas, wantPeers int) (string, string, error) {
	v, err := conn.do(ctx, "SENTINEL", "MASTER", s.masterName)
	if err != nil {
		return "", "", fmt.Errorf("SENTINEL MASTER: %w", err)
	}
	m := redisFieldMap(v)
	addr := net.JoinHostPort(m["ip"], m["port"])
	if m["flags"] != "master" {
		return "master " + addr + " flagged " + m["flags"], addr, nil
	}
	if !sentinelLinkUp(m) {
		return "no PONG from master " + addr + " yet", addr, nil
	}
	v, err = conn.do(ctx, "SENTINEL", "REPLICAS", s.masterName)
	if err != nil {
		return "", "", fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	inSync := 0
	for _, r := range redisList(v) {
		f := redisFieldMap(r)
		if f["flags"] == "slave" && sentinelLinkUp(f) && f["master-link-status"] == "ok" &&
			net.JoinHostPort(f["master-host"], f["master-port"]) == addr {
			inSync++
		}
	}
	if inSync < wantReplicas {
		return fmt.Sprintf("%d of %d replicas of %s in sync", inSync, wantReplicas, addr), addr, nil
	}
	v, err = conn.do(ctx, "SENTINEL", "SENTINELS", s.masterName)
	if err != nil {
		return "", "", fmt.Errorf("SENTINEL SENTINELS: %w", err)
	}
	reachable := 0
	for _, p := range redisList(v) {
		if f := redisFieldMap(p); f["flags"] == "sentinel" && sentinelLinkUp(f) {
			reachable++
		}
	}
	if reachable < wantPeers {
		return fmt.Sprintf("%d of %d other sentinels reachable", reachable, wantPeers), addr, nil
	}
	return "", addr, nil
}

// sentinelLinkUp reports whether a sentinel has had an answer to its last
// PING from the instance that fields describe. last-ping-sent is the age
// of the oldest unanswered PING, and a new link counts as one from its
// creation: flags alone may say a link is up before it ever carried a
// reply.
func sentinelLinkUp(fields map[string]string) bool {
	return fields["last-ping-sent"] == "0"
}

// redisList returns v as an array reply, or nil.
func redisList(v any) []any {
	a, _ := v.([]any)
	return a
}

// WaitHealthy waits until every running sentinel sees the master up with
// every running replica in sync and every other running sentinel
// reachable, and all agree on the master.
func (s *RedisSentinel) WaitHealthy(ctx context.Context) error {
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	return waitRedis(ctx, "the sentinels to agree", func(ctx context.Context) (bool, string, error) {
		if s.isClosed() {
			return false, "", ErrClosed
		}
		status, err := s.healthy(ctx)
		return status == "" && err == nil, status, err
	})
}

// masterVotes asks every running sentinel for the master's address
// (SENTINEL GET-MASTER-ADDR-BY-NAME) and counts the answers.
func (s *RedisSentinel) masterVotes(ctx context.Context) (map[string]int, int, error) {
	sentinels := runningRedisNodes(s.sentinels)
	votes := map[string]int{}
	var errs []error
	for _, sn := range sentinels {
		v, err := sn.do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.masterName)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sn.name, err))
			continue
		}
		a := redisList(v)
		if len(a) != 2 {
			errs = append(errs, fmt.Errorf("%s: GET-MASTER-ADDR-BY-NAME replied %v", sn.name, v))
			continue
		}
		host, _ := a[0].(string)
		port, _ := a[1].(string)
		votes[net.JoinHostPort(host, port)]++
	}
	return votes, len(sentinels), errors.Join(errs...)
}

// Master returns the master's address as a majority of all sentinels
// report it (SENTINEL GET-MASTER-ADDR-BY-NAME). It fails while no address
// has a majority, e.g. in the middle of a failover.
func (s *RedisSentinel) Master(ctx context.Context) (string, error) {
	votes, _, err := s.masterVotes(ctx)
	for addr, n := range votes {
		if n > len(s.sentinels)/2 {
			return addr, nil
		}
	}
	return "", fmt.Errorf("redis sentinel master: no address has a majority of %d sentinels: %v (errors: %v)",
		len(s.sentinels), votes, err)
}

// NodeByAddr returns the data node or sentinel at addr, or nil.
func (s *RedisSentinel) NodeByAddr(addr string) *RedisNode {
	for _, n := range s.all() {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// KillMaster kills the current master (see Master) with SIGKILL and
// returns it.
func (s *RedisSentinel) KillMaster(ctx context.Context) (*RedisNode, error) {
	addr, err := s.Master(ctx)
	if err != nil {
		return nil, fmt.Errorf("kill master: %w", err)
	}
	n := s.NodeByAddr(addr)
	if n == nil {
		return nil, fmt.Errorf("kill master: the sentinels report %s, which is no node of this setup", addr)
	}
	if err := s.Kill(n); err != nil {
		return nil, err
	}
	return n, nil
}

// WaitNewMaster waits until every running sentinel reports the same
// master, other than old, and that node answers as a master (ROLE). It
// returns the new master's address.
func (s *RedisSentinel) WaitNewMaster(ctx context.Context, old string) (string, error) {
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	began := time.Now()
	var addr string
	err := waitRedis(ctx, "a master other than "+old, func(ctx context.Context) (bool, string, error) {
		if s.isClosed() {
			return false, "", ErrClosed
		}
		votes, asked, err := s.masterVotes(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		if len(votes) != 1 {
			return false, fmt.Sprintf("sentinels report %v", votes), nil
		}
		for a, n := range votes {
			addr = a
			if a == old || n != asked {
				return false, fmt.Sprintf("sentinels report %v", votes), nil
			}
		}
		node := s.NodeByAddr(addr)
		if node == nil {
			return false, "", fmt.Errorf("the sentinels report %s, which is no node of this setup", addr)
		}
		v, err := node.do(ctx, "ROLE")
		if err != nil {
			return false, fmt.Sprintf("%s: ROLE: %v", node.name, err), nil
		}
		if role := redisList(v); len(role) == 0 || role[0] != "master" {
			return false, fmt.Sprintf("%s: ROLE = %v", node.name, v), nil
		}
		return true, "", nil
	})
	if err != nil {
		return "", err
	}
	s.logger.Info("redis sentinel failed over", zap.String("old", old), zap.String("new", addr),
		zap.Duration(logKeyTook, time.Since(began)))
	return addr, nil
}

// Kill kills a data node or a sentinel with SIGKILL.
func (s *RedisSentinel) Kill(n *RedisNode) error {
	if err := s.member(n); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	return n.kill()
}

// Start restarts a killed node on its port and waits until it answers. A
// data node comes back empty, with its original role: the first master
// comes back as a master, until the sentinels notice and turn it into a
// replica of the current master, which takes them about 20 s (their INFO
// period and a grace period for a master that claims its role back);
// WaitHealthy waits for that. A sentinel comes back with the config it
// rewrote. The port must still be free: another process may take it while
// the node is down.
func (s *RedisSentinel) Start(ctx context.Context, n *RedisNode) error {
	if err := s.member(n); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return n.start(ctx)
}

// member returns an error unless n belongs to s and s is open.
func (s *RedisSentinel) member(n *RedisNode) error {
	if s.isClosed() {
		return ErrClosed
	}
	if n == nil || !slices.Contains(s.all(), n) {
		return errors.New("not a node of this setup")
	}
	return nil
}

func (s *RedisSentinel) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// MasterName returns the name the sentinels know the master by.
func (s *RedisSentinel) MasterName() string { return s.masterName }

// Nodes returns the data nodes: the first master, then the replicas.
// Roles change with failovers; ask Master for the current master.
func (s *RedisSentinel) Nodes() []*RedisNode { return slices.Clone(s.data) }

// Sentinels returns the sentinels.
func (s *RedisSentinel) Sentinels() []*RedisNode { return slices.Clone(s.sentinels) }

// SentinelAddrs returns the sentinels' addresses.
func (s *RedisSentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		addrs[i] = n.Addr()
	}
	return addrs
}

// SentinelPassword returns the sentinels' password, "" when they have
// none.
func (s *RedisSentinel) SentinelPassword() string { return s.sentPass }

// URL returns the setup's URL for walcount:
//
//	redis+sentinel://[USER:PASSWORD@]127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/MASTER-NAME/0[?sentinel_password=P]
//
// The scheme is rediss+sentinel with TLS (the CA is not part of the URL,
// see RedisTLSConfig). The hosts are the sentinels; the user info holds
// the credentials for the master and the replicas (the first of the
// options' Users, or the default user); the path names the master, as
// the sentinels know it, and the database. The sentinels' own password,
// when they have one, is the query parameter sentinel_password. walcount
// does not parse this form yet; this is the form its parser is to accept.
func (s *RedisSentinel) URL() string { return s.URLFor(s.sec.appUser()) }

// URLFor is URL with the credentials of u for the master and replicas.
func (s *RedisSentinel) URLFor(u RedisUser) string {
	scheme := "redis+sentinel"
	if s.sec.tls != nil {
		scheme = "rediss+sentinel"
	}
	ur := &url.URL{
		Scheme: scheme,
		User:   u.userinfo(),
		Host:   strings.Join(s.SentinelAddrs(), ","),
		Path:   "/" + s.masterName + "/0",
	}
	if s.sentPass != "" {
		ur.RawQuery = url.Values{"sentinel_password": {s.sentPass}}.Encode()
	}
	return ur.String()
}

// Admin returns the credentials of RedisAdminUser on the master and the
// replicas.
func (s *RedisSentinel) Admin() RedisUser { return s.sec.admin }

// TLS returns the TLS files the processes use, nil without TLS.
func (s *RedisSentinel) TLS() *TLSFiles { return s.sec.tls }

// Dir returns the setup's directory, which holds one directory per process.
func (s *RedisSentinel) Dir() string { return s.root }

// LogTails returns the last lines of every process's log, for failure
// messages.
func (s *RedisSentinel) LogTails(lines int) string { return redisLogTails(s.all(), lines) }

// Close kills every process and removes the setup's directory. It is
// idempotent.
func (s *RedisSentinel) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if err := closeRedisNodes(s.all(), s.root); err != nil {
		return fmt.Errorf("close redis sentinel: %w", err)
	}
	return nil
}
