package redisconn

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"
)

// ClusterReloadInterval is how often a cluster client reloads its slot
// map. go-redis reloads it at once when a node answers MOVED, but a
// master that died answers nothing: until the next reload the client
// keeps dialling it. A second bounds that, and a reload also follows every
// connection error (see reloadOnError), so the replica that took over is
// found about as soon as the cluster has promoted it.
const ClusterReloadInterval = time.Second

// New builds the client o describes: a *redis.Client for a single node,
// a *redis.ClusterClient for a cluster and a failover *redis.Client for a
// Sentinel-watched primary. It connects nothing yet. log, when not nil,
// receives go-redis's own log lines from now on (see RouteLogs).
//
// Every client skips CLIENT SETINFO and the maintenance-notification
// handshake: neither is needed, and a least-privilege ACL user that lacks
// them would fill the server's ACL LOG with refusals.
func New(o Options, log *zap.Logger) redis.UniversalClient {
	if log != nil {
		RouteLogs(log)
	}
	noMaint := func() *maintnotifications.Config {
		return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	}
	switch o.Topology {
	case Cluster:
		c := *o.cluster
		c.TLSConfig = o.tlsConfig.Clone()
		c.DisableIdentity = true
		c.MaintNotificationsConfig = noMaint()
		if c.ClusterStateReloadInterval == 0 {
			c.ClusterStateReloadInterval = ClusterReloadInterval
		}
		rdb := redis.NewClusterClient(&c)
		rdb.AddHook(reloadOnError{rdb})
		return rdb
	case Sentinel:
		f := *o.failover
		f.TLSConfig = o.tlsConfig.Clone()
		f.SentinelUsername, f.SentinelPassword = o.SentinelUsername, o.sentinelPassword
		f.DisableIdentity = true
		return redis.NewFailoverClient(&f)
	default:
		s := *o.single
		if o.tlsConfig != nil {
			s.TLSConfig = o.tlsConfig.Clone()
		}
		s.DisableIdentity = true
		s.MaintNotificationsConfig = noMaint()
		return redis.NewClient(&s)
	}
}

// reloadOnError asks a cluster client to reload its slot map whenever a
// command fails in a way that says the map may be stale: the node did not
// answer, or it answered that the cluster is changing.
type reloadOnError struct{ c *redis.ClusterClient }

func (h reloadOnError) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if stale(ctx, err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if stale(ctx, err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

// stale reports whether err suggests that the slot map no longer holds:
// a connection error (refused, reset, timed out) that the caller's own
// context did not cause, or a reply that the cluster is reconfiguring.
func stale(ctx context.Context, err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || ctx.Err() != nil {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	var nerr net.Error
	return errors.As(err, &nerr) || isConnText(err.Error())
}

// isConnText recognises connection failures that reach the caller as
// plain errors.
func isConnText(msg string) bool {
	for _, s := range []string{"connection refused", "connection reset", "broken pipe", "EOF", "i/o timeout", "no route to host"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
