package daemon

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// failoverWithin bounds each wait of the failover tests: the servers'
// failover takes a few seconds, walcount's reconnection a few more, and a
// busy machine may stretch both.
const failoverWithin = 2 * time.Minute

// walcountUser is the ACL user of the topology tests' Redis, with exactly
// the rules walcount documents for a URL of url's topology.
func walcountUser(t *testing.T, url string) servers.RedisUser {
	t.Helper()
	o, err := redisconn.Parse(url, redisconn.TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return servers.RedisUser{Name: "walcount", Password: "walcount-pw", Rules: strings.Fields(redisconn.ACLRules(o))}
}

// TestRedisClusterFailover runs walcount on a Redis Cluster of three
// masters with a replica each under a churn load and kills (SIGKILL) the
// master that holds walcount's keys, after its replica fell behind: the
// replica that takes over lacks the last writes. walcount must notice,
// reconnect to the new master on its own, replay from W and end exact.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	user := walcountUser(t, "redis+cluster://h:1")
	c := testenv.RedisCluster(t, servers.RedisClusterOptions{Masters: 3, ReplicasPerMaster: 1, Users: []servers.RedisUser{user}})
	e := newEnvWith(t, schema, func(e *env) { e.cfg.RedisURL = c.URL() })
	failoverUnderLoad(t, e, redisFailover{
		topology: "cluster",
		admin:    c.Admin(),
		find: func(ctx context.Context) (*servers.RedisNode, *servers.RedisNode) {
			master, err := c.MasterFor(ctx, buffer.KeysFor(e.cfg.Slot).Meta)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range c.Nodes() {
				info, err := nodeClient(t, n, c.Admin()).Info(ctx, "replication").Result()
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+strconv.Itoa(master.Port())+"\r\n") {
					return master, n
				}
			}
			t.Fatalf("no replica follows %s", master.Name())
			return nil, nil
		},
		kill: c.Kill,
		wait: func(ctx context.Context, master *servers.RedisNode) (*servers.RedisNode, error) {
			return c.WaitFailover(ctx, master)
		},
	})
}

// TestRedisSentinelFailover is TestRedisClusterFailover with a master, a
// replica and three sentinels (with a password of their own): the
// sentinels promote the replica, and walcount finds it through them.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	user := walcountUser(t, "redis+sentinel://h:1/walcount")
	s := testenv.RedisSentinel(t, servers.RedisSentinelOptions{MasterName: "walcount", Replicas: 1, Sentinels: 3,
		Users: []servers.RedisUser{user}, SentinelPassword: "sentinel-pw"})
	e := newEnvWith(t, schema, func(e *env) { e.cfg.RedisURL = s.URL() })
	failoverUnderLoad(t, e, redisFailover{
		topology: "sentinel",
		admin:    s.Admin(),
		find: func(ctx context.Context) (*servers.RedisNode, *servers.RedisNode) {
			addr, err := s.Master(ctx)
			if err != nil {
				t.Fatal(err)
			}
			master := s.NodeByAddr(addr)
			for _, n := range s.Nodes() {
				if n != master {
					return master, n
				}
			}
			t.Fatal("the sentinel setup has no replica")
			return nil, nil
		},
		kill: s.Kill,
		wait: func(ctx context.Context, master *servers.RedisNode) (*servers.RedisNode, error) {
			addr, err := s.WaitNewMaster(ctx, master.Addr())
			if err != nil {
				return nil, err
			}
			return s.NodeByAddr(addr), nil
		},
	})
}

// redisFailover is what failoverUnderLoad needs of a Redis topology.
type redisFailover struct {
	topology string
	// admin may run anything on the data nodes.
	admin servers.RedisUser
	// find returns the master of walcount's keys and its replica.
	find func(ctx context.Context) (master, replica *servers.RedisNode)
	// kill kills a node with SIGKILL.
	kill func(*servers.RedisNode) error
	// wait waits until the servers have failed over from master and
	// returns the new master.
	wait func(ctx context.Context, master *servers.RedisNode) (*servers.RedisNode, error)
}

// nodeClient returns a client of one data node as admin.
func nodeClient(t *testing.T, n *servers.RedisNode, admin servers.RedisUser) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), Username: admin.Name, Password: admin.Password,
		DisableIdentity: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// failoverUnderLoad starts a daemon on e and runs a churn load. Once
// walcount has flushed some of it, it stops (SIGSTOP) the replica of the
// master of walcount's keys, cuts their replication link, waits until W
// passes everything that master holds, so that the replica's copy of the
// chain can no longer continue W, kills the master (SIGKILL) and lets the
// replica go on. It then checks that
// walcount
//
//   - reports the outage: walcount_streaming drops to 0 and /readyz fails;
//   - streams again with a new session, and flushes past a mark emitted
//     after the kill, without being restarted;
//   - found that Redis lost data and reset the buffer (a new epoch);
//   - ends exact;
//
// and logs how long each took from the master's death.
func failoverUnderLoad(t *testing.T, e *env, f redisFailover) {
	t.Helper()
	ctx := context.Background()
	topology := f.topology
	core, logs := observer.New(zapcore.InfoLevel)
	m := metrics.New()
	d := e.start(func(o *Options) {
		o.Metrics = m
		o.Logger = zap.New(zapcore.NewTee(core, testLogger(t).Core()))
	})
	waitFor(t, "the daemon streaming", func() bool { return gaugeValue(m.Streaming) == 1 })

	loadCtx, stopLoad := context.WithCancel(ctx)
	w := newWorkload(e.db)
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); w.run(loadCtx, 4, 1<<30) }()
	defer func() { stopLoad(); <-loadDone }()
	// The kill comes once walcount has flushed some of the load: the
	// checkpoint passes a mark emitted after the load started.
	waitCheckpointPast(t, e, e.mark(), failoverWithin)

	master, replica := f.find(ctx)
	meta := buffer.KeysFor(e.cfg.Slot).Meta
	if err := syscall.Kill(replica.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(replica.PID(), syscall.SIGCONT); err != nil {
				t.Errorf("resume %s: %v", replica.Name(), err)
			}
		}
	}
	defer resume()
	// A stopped replica would still find in its socket what the master
	// sent before it stopped: cut the link, so that the master's later
	// writes reach no replica.
	admin := nodeClient(t, master, f.admin)
	if err := admin.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	held, err := admin.HMGet(ctx, meta, "lsn", "epoch").Result()
	if err != nil {
		t.Fatal(err)
	}
	heldLSN, _ := held[0].(string)
	epoch, _ := held[1].(string)
	lsn, err := buffer.ParseLSN(heldLSN)
	if err != nil || epoch == "" {
		t.Fatalf("meta of the master: %v (%v)", held, err)
	}
	waitCheckpointPast(t, e, lsn, failoverWithin)
	if err := f.kill(master); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	resume()
	mark := e.mark()
	t.Logf("%s: killed %s, the master of walcount's keys, under load, after its replica %s fell behind W", topology, master.Name(), replica.Name())

	var (
		newMaster   *servers.RedisNode
		serversErr  error
		serversDone = make(chan struct{})
	)
	go func() {
		defer close(serversDone)
		newMaster, serversErr = f.wait(ctx, master)
		if serversErr == nil {
			t.Logf("%s: the servers failed over to %s %s after the kill", topology, newMaster.Name(), time.Since(killedAt).Round(time.Millisecond))
		}
	}()

	// Watch the daemon's own state, which costs no I/O, so that the
	// times are not stretched by calls to a dead server.
	session := func() (bool, time.Time) {
		d.d.mu.Lock()
		defer d.d.mu.Unlock()
		return d.d.state.streaming, d.d.state.sessionStart
	}
	var (
		sawDown              bool
		streamAgain, flushed time.Duration
		lastCheckpoint       cdc.LSN
		checkpointErr        error
		readyErr             = make(chan error, 1)
		deadline             = killedAt.Add(failoverWithin)
	)
	if !wait.Until(time.Until(deadline), 10*time.Millisecond, func() bool {
		if gaugeValue(m.Streaming) == 0 && !sawDown {
			sawDown = true
			// /readyz during the outage, once, beside the watch.
			go func() {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				readyErr <- d.d.Ready(rctx)
			}()
		}
		if streaming, started := session(); streamAgain == 0 && streaming && started.After(killedAt) {
			streamAgain = started.Sub(killedAt)
		}
		if flushed == 0 {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			lastCheckpoint, checkpointErr = e.checkpoint(qctx)
			cancel()
			if checkpointErr == nil && lastCheckpoint > mark {
				flushed = time.Since(killedAt)
			}
		}
		return streamAgain != 0 && flushed != 0
	}) {
		t.Fatalf("%s: after %s: streaming again after %s, flushed past the mark after %s (checkpoint %s, %v)",
			topology, failoverWithin, streamAgain, flushed, lastCheckpoint, checkpointErr)
	}
	t.Logf("%s failover: walcount streams again %s after the master's death and has flushed past a mark emitted after it %s after",
		topology, streamAgain.Round(time.Millisecond), flushed.Round(time.Millisecond))
	if !sawDown {
		t.Errorf("%s: walcount_streaming never dropped to 0 during the outage", topology)
	} else if err := <-readyErr; err == nil {
		t.Errorf("%s: /readyz passed while walcount_streaming was 0", topology)
	} else {
		t.Logf("%s: /readyz during the outage: %v", topology, err)
	}
	<-serversDone
	if serversErr != nil {
		t.Fatalf("%s: the servers did not fail over: %v", topology, serversErr)
	}
	if newMaster != replica {
		t.Fatalf("%s: %s took over, not the replica %s", topology, newMaster.Name(), replica.Name())
	}

	stopLoad()
	<-loadDone
	w.report(t)
	// More traffic on the new master, then everything must be exact.
	e.moreLikesThenExact()
	waitFor(t, "/readyz to pass again", func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return d.d.Ready(rctx) == nil && gaugeValue(m.Streaming) == 1
	})
	// The replica's chain could not continue W: walcount must have found
	// the loss and started a new chain, with a new epoch.
	after, err := nodeClient(t, newMaster, f.admin).HGet(ctx, meta, "epoch").Result()
	if err != nil {
		t.Fatal(err)
	}
	if after == epoch {
		t.Errorf("%s: the buffer's epoch is still %s: walcount did not reset the chain the replica could not continue", topology, epoch)
	}
	// The documented ACL rules gave walcount every command it ran.
	if refused, err := nodeClient(t, newMaster, f.admin).Do(ctx, "ACL", "LOG").Slice(); err != nil || len(refused) != 0 {
		t.Errorf("%s: Redis refused commands of walcount: ACL LOG = %v (%v)", topology, refused, err)
	}
	failures := logs.FilterMessage("session failed; retrying").Len()
	t.Logf("%s: %d session failures logged at error level; the buffer was reset (epoch %s → %s)", topology, failures, epoch, after)
	if failures == 0 {
		t.Errorf("%s: the outage was not logged", topology)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// waitCheckpointPast waits until walcount's checkpoint passes lsn.
func waitCheckpointPast(t *testing.T, e *env, lsn cdc.LSN, within time.Duration) {
	t.Helper()
	var w cdc.LSN
	var err error
	if !wait.Until(within, 20*time.Millisecond, func() bool {
		qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		w, err = e.checkpoint(qctx)
		cancel()
		return err == nil && w > lsn
	}) {
		t.Fatalf("the checkpoint did not pass %s within %s (at %s, %v)", lsn, within, w, err)
	}
}

// TestRedisMove moves a running deployment from a single Redis server to
// a Cluster or to Sentinel, as docs/upgrade.md says: walcount stopped,
// redis_url changed, walcount started. The new Redis is empty, so walcount
// replays from its checkpoint W what the old buffer held. In the crash
// variant walcount dies (a simulated kill -9) with deltas applied to the
// old Redis and not flushed: they must not be lost, nor counted twice.
func TestRedisMove(t *testing.T) {
	t.Parallel()
	topologies := []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"cluster", func(t *testing.T) string {
			user := walcountUser(t, "redis+cluster://h:1")
			return testenv.RedisCluster(t, servers.RedisClusterOptions{Masters: 3, Users: []servers.RedisUser{user}}).URL()
		}},
		{"sentinel", func(t *testing.T) string {
			user := walcountUser(t, "redis+sentinel://h:1/walcount")
			return testenv.RedisSentinel(t, servers.RedisSentinelOptions{MasterName: "walcount", Replicas: 1, Sentinels: 3,
				Users: []servers.RedisUser{user}, SentinelPassword: "sentinel-pw"}).URL()
		}},
	}
	for _, topo := range topologies {
		for _, crash := range []bool{false, true} {
			name := topo.name + "/stopped"
			if crash {
				name = topo.name + "/killed"
			}
			topo, crash := topo, crash
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				ctx := context.Background()
				w := newWorkload(e.db)
				if crash {
					// Crash once deltas are applied to the old Redis,
					// before their flush.
					fp := &failpoint.Set{}
					disarm := fp.CrashAfter(failpoint.AfterApply, 5)
					d := e.start(func(o *Options) { o.Failpoints = fp })
					loadCtx, stopLoad := context.WithCancel(ctx)
					loadDone := make(chan struct{})
					go func() { defer close(loadDone); w.run(loadCtx, 3, 300) }()
					if err := d.wait(t, 2*time.Minute); !errors.Is(err, failpoint.ErrCrash) {
						t.Fatalf("daemon returned %v, want the simulated crash", err)
					}
					disarm()
					stopLoad()
					<-loadDone
					if pending, err := e.rdb().Keys(ctx, "walcount:*").Result(); err != nil || len(pending) == 0 {
						t.Fatalf("the old Redis holds %v (%v); want the crashed walcount's buffer", pending, err)
					}
				} else {
					d := e.start()
					w.run(ctx, 3, 300)
					e.waitCaughtUp(catchUp)
					if err := d.stop(t); err != nil {
						t.Fatal(err)
					}
				}
				w.report(t)
				// Writes while walcount is down, then the new Redis.
				newWorkload(e.db).run(ctx, 2, 50)
				e.cfg.RedisURL = topo.url(t)
				d2 := e.start()
				newWorkload(e.db).run(ctx, 2, 50)
				e.waitCaughtUp(catchUp)
				e.assertExact()
				if err := d2.stop(t); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
