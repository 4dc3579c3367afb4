package servers

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// redisClusterSlots is the number of hash slots of a Redis Cluster.
const redisClusterSlots = 16384

// DefaultRedisClusterNodeTimeout is the cluster-node-timeout of a cluster
// whose options leave it zero. A master is suspected after it and failed
// over about a second later, which keeps failover tests short; a healthy
// node answers pings in well under a millisecond even on a busy machine,
// so it is not mistaken for a dead one.
const DefaultRedisClusterNodeTimeout = time.Second

// RedisClusterOptions configures StartRedisCluster. The zero value is a
// cluster of three masters without replicas.
type RedisClusterOptions struct {
	// Masters is the number of masters, which share the hash slots evenly.
	// 0 means 3. At least 3 (redis-cli --cluster create needs them, and
	// a failover needs a majority of the masters to agree that one failed).
	Masters int
	// ReplicasPerMaster is the number of replicas of each master.
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout. 0 means
	// DefaultRedisClusterNodeTimeout.
	NodeTimeout time.Duration
	// TLS, when set, makes every node TLS-only (port 0, tls-port), the
	// cluster bus and replication included, with these files.
	TLS *TLSFiles
	// RequireClientCert makes the nodes demand a client certificate signed
	// by the CA (tls-auth-clients yes). It needs TLS.
	RequireClientCert bool
	// Users are ACL users on every node. See RedisUser.
	Users []RedisUser
	// Password, when set, protects the default user with it.
	Password string
	// DisableDefaultUser turns the default user off: clients must log in
	// as one of Users.
	DisableDefaultUser bool
	// Logger receives start, kill and failover events. nil means no logging.
	Logger *zap.Logger
}

// RedisCluster is a Redis Cluster of redis-server processes on 127.0.0.1
// started by StartRedisCluster, with persistence off. Its methods are safe
// for concurrent use.
//
// A go-redis ClusterClient reloads its slot map when a node answers MOVED,
// but not when the master of a slot stops answering: until the next
// periodic reload (ClusterOptions.ClusterStateReloadInterval, 60 s by
// default) it keeps dialling a killed master. Clients in failover tests
// need a short interval, or a call to ReloadState on connection errors.
type RedisCluster struct {
	root   string
	nodes  []*RedisNode
	sec    *redisSecurity
	logger *zap.Logger

	mu          sync.Mutex
	killedSlots map[*RedisNode]string // slots a node served when Kill killed it
	closed      bool
}

// StartRedisCluster starts Masters+Masters*ReplicasPerMaster cluster nodes
// in parallel, each in its own directory with its own nodes.conf, joins
// them into a cluster (node i < Masters serves the i-th share of the
// slots; redis-cli picks which master each replica follows), and waits
// until every node reports cluster_state:ok, all nodes agree on who
// serves which slots and every replica's link to its master is up. ctx
// bounds the start; with no deadline, DefaultStartTimeout applies.
//
// The cluster is joined by `redis-cli --cluster create` (Debian's
// redis-tools, a dependency of redis-server), which gives the nodes
// distinct config epochs, the masters their slots, makes the nodes meet
// and the replicas follow a master; it needs at least three masters. Its
// one-second waits overlap the two seconds a master holds back
// cluster_state:ok after its start (below): a start measured 2.04-2.13 s
// with it, 2.08-2.45 s with the CLUSTER commands it replaced.
//
// Every node has cluster-replica-validity-factor 0, so that a replica
// takes over however long it has been disconnected, and its own
// cluster-port, picked free like the data port, so that data ports above
// 55535 work.
//
// A start takes about two seconds whatever the machine: a master reports
// cluster_state:ok no earlier than two seconds after its own start (Redis
// holds a restarted master back that long, so that the cluster can demote
// it first).
func StartRedisCluster(ctx context.Context, opt RedisClusterOptions) (_ *RedisCluster, err error) {
	if opt.Masters == 0 {
		opt.Masters = 3
	}
	if opt.Masters < 3 || opt.ReplicasPerMaster < 0 {
		return nil, fmt.Errorf("start redis cluster: invalid size: %d masters, %d replicas per master",
			opt.Masters, opt.ReplicasPerMaster)
	}
	if opt.NodeTimeout == 0 {
		opt.NodeTimeout = DefaultRedisClusterNodeTimeout
	}
	bin, sec, root, err := prepareRedis("walcount-redis-cluster-", opt.TLS, opt.RequireClientCert, opt.Users, opt.Password, opt.DisableDefaultUser)
	if err != nil {
		return nil, fmt.Errorf("start redis cluster: %w", err)
	}
	c := &RedisCluster{root: root, sec: sec, logger: opt.Logger, killedSlots: map[*RedisNode]string{}}
	if c.logger == nil {
		c.logger = zap.NewNop()
	}
	defer closeFailedStart(&err, func() []*RedisNode { return c.nodes }, root)
	total := opt.Masters * (1 + opt.ReplicasPerMaster)
	for i := range total {
		n, err := newRedisNode(root, "node"+strconv.Itoa(i), bin, sec.adminAccess(), c.logger)
		if err != nil {
			return nil, fmt.Errorf("start redis cluster: %w", err)
		}
		n.bus = true
		n.conf = clusterNodeConf(n.dir, sec, opt.NodeTimeout)
		c.nodes = append(c.nodes, n)
	}
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	began := time.Now()
	if err := startRedisNodes(ctx, c.nodes); err != nil {
		return nil, fmt.Errorf("start redis cluster: %w", err)
	}
	if err := c.create(ctx, opt.ReplicasPerMaster); err != nil {
		return nil, fmt.Errorf("start redis cluster: %w", err)
	}
	c.logger.Info("redis cluster started", zap.Int("nodes", total), zap.Duration(logKeyTook, time.Since(began)))
	return c, nil
}

// clusterNodeConf returns the config function of a cluster node in dir.
func clusterNodeConf(dir string, sec *redisSecurity, nodeTimeout time.Duration) func(port, busPort int) string {
	return func(port, busPort int) string {
		var c redisConf
		addRedisDataDefaults(&c, dir)
		sec.addListen(&c, port)
		if sec.tls != nil {
			c.add("tls-cluster", "yes")
		}
		sec.addACL(&c)
		c.add("cluster-enabled", "yes")
		c.add("cluster-config-file", "nodes.conf")
		c.add("cluster-port", strconv.Itoa(busPort))
		c.add("cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		c.add("cluster-replica-validity-factor", "0")
		// Replicas stay with the master they were given, so that a test
		// knows the topology it kills nodes in.
		c.add("cluster-allow-replica-migration", "no")
		c.add("cluster-require-full-coverage", "yes")
		return c.String()
	}
}

// create joins the started nodes into a cluster with
// `redis-cli --cluster create` and waits until it is healthy.
func (c *RedisCluster) create(ctx context.Context, replicasPerMaster int) error {
	for _, n := range c.nodes {
		id, err := n.doString(ctx, "CLUSTER", "MYID")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %w", n.name, err)
		}
		n.id = id
	}
	cli, err := findRedisCLI()
	if err != nil {
		return err
	}
	var args []string
	if f := c.sec.tls; f != nil {
		// MakeTLSFiles' server certificate is valid for clients too.
		args = append(args, "--tls", "--cacert", f.CAFile, "--cert", f.ServerCert, "--key", f.ServerKey)
	}
	if a := c.sec.admin; a.Name != "" {
		args = append(args, "--user", a.Name)
	}
	args = append(args, "--cluster", "create")
	for _, n := range c.nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.Env = os.Environ()
	if p := c.sec.admin.Password; p != "" {
		// In the environment rather than on the command line (-a), where
		// ps would show it.
		cmd.Env = append(cmd.Env, "REDISCLI_AUTH="+p)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	return c.WaitHealthy(ctx)
}

// redisClusterEntry is one line of CLUSTER NODES.
type redisClusterEntry struct {
	id     string
	flags  []string
	master string // the master's id for a replica, "-" for a master
	slots  []string
}

func (e redisClusterEntry) has(flag string) bool { return slices.Contains(e.flags, flag) }

// role returns "master" or "replica".
func (e redisClusterEntry) role() string {
	if e.has("slave") {
		return "replica"
	}
	return "master"
}

// shape is what every node must agree on about a node: its role, its
// master and its slots.
func (e redisClusterEntry) shape() string {
	return e.role() + " of " + e.master + " slots " + strings.Join(e.slots, ",")
}

// slotRanges yields the first and last slot of each of e.slots ("5" or
// "0-5460").
func (e redisClusterEntry) slotRanges() iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for _, s := range e.slots {
			lo, hi, isRange := strings.Cut(s, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if isRange {
				b, _ = strconv.Atoi(hi)
			}
			if !yield(a, b) {
				return
			}
		}
	}
}

// slotCount returns the number of slots in e.slots.
func (e redisClusterEntry) slotCount() int {
	n := 0
	for a, b := range e.slotRanges() {
		n += b - a + 1
	}
	return n
}

// ownsSlot reports whether e.slots contains slot.
func (e redisClusterEntry) ownsSlot(slot int) bool {
	for a, b := range e.slotRanges() {
		if slot >= a && slot <= b {
			return true
		}
	}
	return false
}

// parseRedisClusterNodes parses the reply of CLUSTER NODES. Slots being
// migrated ("[slot->-id]") are left out.
func parseRedisClusterNodes(s string) (entries map[string]redisClusterEntry, myself string) {
	entries = map[string]redisClusterEntry{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		e := redisClusterEntry{id: f[0], flags: strings.Split(f[2], ","), master: f[3]}
		for _, s := range f[8:] {
			if !strings.HasPrefix(s, "[") {
				e.slots = append(e.slots, s)
			}
		}
		if e.has("myself") {
			myself = e.id
		}
		entries[e.id] = e
	}
	return entries, myself
}

// redisClusterView is what one node says about the cluster.
type redisClusterView struct {
	entries    map[string]redisClusterEntry
	myself     string
	state      string // cluster_state of CLUSTER INFO
	masterLink string // master_link_status of a replica, "" for a master
}

// viewOf asks n for its view of the cluster.
func (c *RedisCluster) viewOf(ctx context.Context, n *RedisNode) (redisClusterView, error) {
	conn, err := dialRedis(ctx, n.Addr(), n.access)
	if err != nil {
		return redisClusterView{}, err
	}
	defer conn.Close()
	nodes, err := conn.doString(ctx, "CLUSTER", "NODES")
	if err != nil {
		return redisClusterView{}, fmt.Errorf("CLUSTER NODES: %w", err)
	}
	var v redisClusterView
	v.entries, v.myself = parseRedisClusterNodes(nodes)
	info, err := conn.doString(ctx, "CLUSTER", "INFO")
	if err != nil {
		return redisClusterView{}, fmt.Errorf("CLUSTER INFO: %w", err)
	}
	v.state = parseRedisInfo(info)["cluster_state"]
	if v.entries[v.myself].role() == "replica" {
		repl, err := conn.doString(ctx, "INFO", "replication")
		if err != nil {
			return redisClusterView{}, fmt.Errorf("INFO replication: %w", err)
		}
		v.masterLink = parseRedisInfo(repl)["master_link_status"]
	}
	return v, nil
}

// healthy checks the cluster once: every running node answers, reports
// cluster_state:ok and knows every node; all running nodes agree on the
// role, master and slots of every running node and flag none of them as
// failing; every slot is served by a running master; and every running
// replica follows a running master over a link that is up. Nodes that were
// killed only have to serve no slots. On success it returns the agreed
// entries, by node id.
func (c *RedisCluster) healthy(ctx context.Context) (map[string]redisClusterEntry, string, error) {
	var live []*RedisNode
	for _, n := range c.nodes {
		if n.Running() {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return nil, "no node is running", nil
	}
	views := make([]redisClusterView, len(live))
	errs := make([]error, len(live))
	var wg sync.WaitGroup
	for i, n := range live {
		wg.Go(func() { views[i], errs[i] = c.viewOf(ctx, n) })
	}
	wg.Wait()
	for i, n := range live {
		if errs[i] != nil {
			return nil, fmt.Sprintf("%s does not answer: %v", n.name, errs[i]), nil
		}
	}
	liveIDs := map[string]*RedisNode{}
	for _, n := range live {
		liveIDs[n.ID()] = n
	}
	ref := views[0].entries
	for i, n := range live {
		v := views[i]
		if v.state != "ok" {
			return nil, fmt.Sprintf("%s: cluster_state:%s", n.name, v.state), nil
		}
		for _, m := range c.nodes {
			e, ok := v.entries[m.ID()]
			switch {
			case !ok:
				return nil, fmt.Sprintf("%s does not know %s", n.name, m.name), nil
			case liveIDs[m.ID()] == nil:
				if len(e.slots) > 0 {
					return nil, fmt.Sprintf("%s still sees slots %v served by %s, which is down",
						n.name, e.slots, m.name), nil
				}
			case e.has("fail") || e.has("fail?") || e.has("handshake") || e.has("noaddr"):
				return nil, fmt.Sprintf("%s flags %s as %v", n.name, m.name, e.flags), nil
			case e.shape() != ref[m.ID()].shape():
				return nil, fmt.Sprintf("%s and %s disagree about %s: %q vs %q",
					live[0].name, n.name, m.name, ref[m.ID()].shape(), e.shape()), nil
			}
		}
		if v.masterLink != "" && v.masterLink != "up" {
			return nil, fmt.Sprintf("%s: master_link_status:%s", n.name, v.masterLink), nil
		}
	}
	covered := 0
	for id, e := range ref {
		if liveIDs[id] == nil {
			continue
		}
		if e.role() == "replica" && liveIDs[e.master] == nil {
			return nil, fmt.Sprintf("%s follows a master that is down", liveIDs[id].name), nil
		}
		if e.role() == "master" {
			covered += e.slotCount()
		}
	}
	if covered != redisClusterSlots {
		return nil, fmt.Sprintf("running masters serve %d of %d slots", covered, redisClusterSlots), nil
	}
	return ref, "", nil
}

// WaitHealthy waits until the cluster is healthy: every running node
// reports cluster_state:ok, all agree on the roles and slots of the running
// nodes, every slot is served by a running master and every running
// replica's link to its master is up.
func (c *RedisCluster) WaitHealthy(ctx context.Context) error {
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	return waitRedis(ctx, "a healthy cluster", func(ctx context.Context) (bool, string, error) {
		if c.isClosed() {
			return false, "", ErrClosed
		}
		ref, status, err := c.healthy(ctx)
		return ref != nil, status, err
	})
}

// Nodes returns every node, in creation order: masters first, then the
// replicas (redis-cli chose which master each follows). Roles change with
// failovers; ask Masters or MasterFor for the current ones.
func (c *RedisCluster) Nodes() []*RedisNode { return slices.Clone(c.nodes) }

// Addrs returns the addresses of all nodes, a seed list for clients.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// URL returns the cluster's URL for walcount,
// redis+cluster://[USER:PASSWORD@]127.0.0.1:P1,127.0.0.1:P2,... (the
// scheme is rediss+cluster with TLS; the CA is not part of the URL, see
// RedisTLSConfig). The host part is the seed list: every node. The user is
// the first of the options' Users, or the default user.
func (c *RedisCluster) URL() string { return c.URLFor(c.sec.appUser()) }

// URLFor is URL with the credentials of u.
func (c *RedisCluster) URLFor(u RedisUser) string {
	scheme := "redis+cluster"
	if c.sec.tls != nil {
		scheme = "rediss+cluster"
	}
	return (&url.URL{Scheme: scheme, User: u.userinfo(), Host: strings.Join(c.Addrs(), ",")}).String()
}

// Admin returns the credentials of RedisAdminUser on this cluster's nodes.
func (c *RedisCluster) Admin() RedisUser { return c.sec.admin }

// TLS returns the TLS files the nodes use, nil without TLS.
func (c *RedisCluster) TLS() *TLSFiles { return c.sec.tls }

// anyView returns the entries of CLUSTER NODES of the first running node
// that answers.
func (c *RedisCluster) anyView(ctx context.Context) (map[string]redisClusterEntry, *RedisNode, error) {
	var errs []error
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		s, err := n.doString(ctx, "CLUSTER", "NODES")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
			continue
		}
		entries, _ := parseRedisClusterNodes(s)
		return entries, n, nil
	}
	if len(errs) == 0 {
		return nil, nil, errors.New("no node is running")
	}
	return nil, nil, errors.Join(errs...)
}

// nodeByID returns the node with the cluster node id, or nil.
func (c *RedisCluster) nodeByID(id string) *RedisNode {
	for _, n := range c.nodes {
		if n.ID() == id {
			return n
		}
	}
	return nil
}

// Masters returns the nodes that serve slots, as a running node sees them
// now.
func (c *RedisCluster) Masters(ctx context.Context) ([]*RedisNode, error) {
	entries, _, err := c.anyView(ctx)
	if err != nil {
		return nil, fmt.Errorf("redis cluster masters: %w", err)
	}
	var out []*RedisNode
	for _, n := range c.nodes {
		if e, ok := entries[n.ID()]; ok && e.role() == "master" && len(e.slots) > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

// MasterFor returns the master that serves key's hash slot, as a running
// node sees it now (CLUSTER KEYSLOT, then CLUSTER NODES).
func (c *RedisCluster) MasterFor(ctx context.Context, key string) (*RedisNode, error) {
	entries, asked, err := c.anyView(ctx)
	if err != nil {
		return nil, fmt.Errorf("redis cluster master for %q: %w", key, err)
	}
	v, err := asked.do(ctx, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, fmt.Errorf("redis cluster master for %q: CLUSTER KEYSLOT: %w", key, err)
	}
	slot, ok := v.(int64)
	if !ok {
		return nil, fmt.Errorf("redis cluster master for %q: CLUSTER KEYSLOT replied %T", key, v)
	}
	for id, e := range entries {
		if e.role() == "master" && e.ownsSlot(int(slot)) {
			if n := c.nodeByID(id); n != nil {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("redis cluster master for %q: no master serves slot %d according to %s", key, slot, asked.name)
}

// Kill kills node with SIGKILL: it loses its data set but keeps its
// nodes.conf. When it was a master with a replica, the cluster fails it
// over once NodeTimeout has passed (about three seconds in all with the
// default); WaitFailover waits for that.
func (c *RedisCluster) Kill(node *RedisNode) error {
	if err := c.member(node); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if !node.Running() {
		return node.kill()
	}
	// Remember which slots the node served, so that WaitFailover can tell
	// who took them over. A node that nobody else can be asked about
	// (the last one running) is simply killed.
	var slots string
	if entries, _, err := c.anyViewExcept(context.Background(), node); err == nil {
		slots = strings.Join(entries[node.ID()].slots, ",")
	}
	if err := node.kill(); err != nil {
		return err
	}
	c.mu.Lock()
	c.killedSlots[node] = slots
	c.mu.Unlock()
	return nil
}

// anyViewExcept is anyView without asking skip.
func (c *RedisCluster) anyViewExcept(ctx context.Context, skip *RedisNode) (map[string]redisClusterEntry, *RedisNode, error) {
	ctx, cancel := context.WithTimeout(ctx, redisCommandTimeout)
	defer cancel()
	for _, n := range c.nodes {
		if n == skip || !n.Running() {
			continue
		}
		s, err := n.doString(ctx, "CLUSTER", "NODES")
		if err != nil {
			continue
		}
		entries, _ := parseRedisClusterNodes(s)
		return entries, n, nil
	}
	return nil, nil, errors.New("no other node answers")
}

// WaitFailover waits until the cluster has recovered from the death of
// killed: another node serves the slots killed served and the cluster is
// healthy again (see WaitHealthy). It returns the node that now serves
// those slots, or nil when killed served none (a replica).
func (c *RedisCluster) WaitFailover(ctx context.Context, killed *RedisNode) (*RedisNode, error) {
	if err := c.member(killed); err != nil {
		return nil, fmt.Errorf("wait failover: %w", err)
	}
	if killed.Running() {
		return nil, fmt.Errorf("wait failover: %s runs; Kill it first", killed.name)
	}
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	began := time.Now()
	var agreed map[string]redisClusterEntry
	err := waitRedis(ctx, "the failover of "+killed.name, func(ctx context.Context) (bool, string, error) {
		if c.isClosed() {
			return false, "", ErrClosed
		}
		ref, status, err := c.healthy(ctx)
		agreed = ref
		return ref != nil, status, err
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	slots := c.killedSlots[killed]
	c.mu.Unlock()
	if slots == "" {
		return nil, nil
	}
	first, _, _ := strings.Cut(slots, ",")
	first, _, _ = strings.Cut(first, "-")
	slot, _ := strconv.Atoi(first)
	for _, id := range slices.Sorted(maps.Keys(agreed)) {
		if e := agreed[id]; e.role() == "master" && e.ownsSlot(slot) {
			n := c.nodeByID(id)
			c.logger.Info("redis cluster failed over", zap.String("killed", killed.name),
				zap.String("new_master", n.name), zap.Duration(logKeyTook, time.Since(began)))
			return n, nil
		}
	}
	return nil, fmt.Errorf("wait failover: no master serves slot %d", slot)
}

// Start restarts a killed node on its ports and waits until the cluster is
// healthy with it. The node comes back with an empty data set (persistence
// is off) but with its nodes.conf, so it rejoins under its node id: a
// master that was failed over returns as a replica of the node that took
// its slots over, and resynchronises from it. The ports must still be
// free: another process may take them while the node is down.
func (c *RedisCluster) Start(ctx context.Context, node *RedisNode) error {
	if err := c.member(node); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	if err := node.start(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.killedSlots, node)
	c.mu.Unlock()
	return c.WaitHealthy(ctx)
}

// member returns an error unless n is a node of c and c is open.
func (c *RedisCluster) member(n *RedisNode) error {
	if c.isClosed() {
		return ErrClosed
	}
	if n == nil || !slices.Contains(c.nodes, n) {
		return errors.New("not a node of this cluster")
	}
	return nil
}

func (c *RedisCluster) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// LogTails returns the last lines of every node's log, for failure
// messages.
func (c *RedisCluster) LogTails(lines int) string { return redisLogTails(c.nodes, lines) }

// Close kills every node and removes the cluster's directory. It is
// idempotent.
func (c *RedisCluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if err := closeRedisNodes(c.nodes, c.root); err != nil {
		return fmt.Errorf("close redis cluster: %w", err)
	}
	return nil
}

// Dir returns the cluster's directory, which holds one directory per node.
func (c *RedisCluster) Dir() string { return c.root }
