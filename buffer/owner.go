package buffer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/operator"
)

// A deployment is one PostgreSQL cluster (a primary and the standbys copied
// from it, which share its system identifier) with the walcount that follows
// its slot. Two deployments that share a Redis and a slot name would write
// the same keys: each would find the other's chain, take it for a history
// of its own that another server wrote (a failover, a restore), reset it and
// replay, over and over. So the daemon that owns a chain stamps it every
// AliveInterval, and a daemon of another system that finds a chain stamped
// less than AliveStale ago refuses to touch it (OtherDeploymentError).
const (
	// AliveInterval is how often a streaming daemon stamps its chain.
	AliveInterval = 5 * time.Second
	// AliveStale is how long after its last stamp a chain of another
	// system is taken for abandoned (that cluster replaced, upgraded with
	// pg_upgrade, or gone) and may be reset. A walcount that stops cleanly
	// removes its stamp (MarkStopped): its chain may be reset at once.
	AliveStale = 30 * time.Second
)

// ErrOtherDeployment is wrapped by *OtherDeploymentError.
var ErrOtherDeployment = operator.NewError("the redis buffer belongs to another deployment")

// OtherDeploymentError says that the slot's keys in Redis are kept by the
// walcount of another PostgreSQL cluster, which stamped them Age ago.
type OtherDeploymentError struct {
	Slot string
	// Theirs and Ours are the system identifiers of the chain's owner and
	// of the server this walcount follows.
	Theirs, Ours string
	Age          time.Duration
}

func (e *OtherDeploymentError) Error() string {
	keys := KeysFor(e.Slot)
	return fmt.Sprintf("the Redis keys of slot %q are kept by the walcount of another PostgreSQL cluster "+
		"(system identifier %s, last seen %s ago; this server's is %s): two deployments share this Redis with the same slot name, "+
		"and each would reset the other's buffer. Fix: give this deployment a slot name of its own (slot, --slot or WALCOUNT_SLOT, "+
		"then walcount setup) or a Redis database of its own (redis_url redis://host:6379/N); if that other cluster is gone for good "+
		"(this cluster's former self, before a pg_upgrade or a restore from a backup, included), wait %s after its walcount stopped, or delete its keys (DEL %s)",
		e.Slot, e.Theirs, e.Age.Round(time.Second), e.Ours, AliveStale, strings.Join(keys.All(), " "))
}

// Unwrap makes errors.Is(err, ErrOtherDeployment) true.
func (e *OtherDeploymentError) Unwrap() error { return ErrOtherDeployment }

// System returns the system identifier of a history
// ("<system identifier>/<timeline>"), "" when it has none.
func System(history string) string {
	sys, _, _ := strings.Cut(history, "/")
	return sys
}

// aliveScript stamps the meta hash with ARGV[2] (Unix seconds) when its
// chain was written against system ARGV[1], and reports whether it did.
var aliveScript = redis.NewScript(`
local hist = redis.call('HGET', KEYS[1], 'hist')
if not hist then return 0 end
local sys = string.match(hist, '^[^/]*')
if sys ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'alive', ARGV[2])
return 1
`)

// MarkAlive stamps the chain with now when it is still a chain of system
// sys; it reports false when it is not (missing, or another system's).
func (b *Redis) MarkAlive(ctx context.Context, sys string, now time.Time) (bool, error) {
	n, err := aliveScript.Run(ctx, b.rdb, []string{b.keys.Meta}, sys, now.Unix()).Int()
	if err != nil {
		return false, fmt.Errorf("stamp redis buffer: %w", err)
	}
	return n == 1, nil
}

// stoppedScript removes the stamp of the meta hash when its chain was
// written against system ARGV[1].
var stoppedScript = redis.NewScript(`
local hist = redis.call('HGET', KEYS[1], 'hist')
if not hist then return 0 end
local sys = string.match(hist, '^[^/]*')
if sys ~= ARGV[1] then return 0 end
return redis.call('HDEL', KEYS[1], 'alive')
`)

// MarkStopped removes the stamp of a chain of system sys: its walcount
// stopped cleanly, so no walcount keeps it any more, and the walcount of
// another system (this cluster after pg_upgrade, or restored from a
// backup) may take it over at once instead of AliveStale later. A walcount
// of this system that starts again stamps it anew.
func (b *Redis) MarkStopped(ctx context.Context, sys string) error {
	if err := stoppedScript.Run(ctx, b.rdb, []string{b.keys.Meta}, sys).Err(); err != nil {
		return fmt.Errorf("unstamp redis buffer: %w", err)
	}
	return nil
}

// CheckOwner fails with an *OtherDeploymentError when the chain in Redis
// was written against another system than history's and its owner stamped
// it less than AliveStale before now. A chain of the same system (this
// cluster before a failover, a standby promoted), one never stamped (an
// older walcount's) or one whose owner is silent is left to the caller.
func (b *Redis) CheckOwner(ctx context.Context, history string, now time.Time) error {
	vals, err := b.rdb.HMGet(ctx, b.keys.Meta, "hist", "alive").Result()
	if err != nil {
		return fmt.Errorf("read redis meta: %w", err)
	}
	hist, _ := vals[0].(string)
	alive, _ := vals[1].(string)
	theirs, ours := System(hist), System(history)
	if theirs == "" || ours == "" || theirs == ours || alive == "" {
		return nil
	}
	secs, err := strconv.ParseInt(alive, 10, 64)
	if err != nil {
		return nil
	}
	// A stamp from the future (clocks apart) counts as fresh.
	age := max(now.Sub(time.Unix(secs, 0)), 0)
	if age >= AliveStale {
		return nil
	}
	return &OtherDeploymentError{Slot: b.slot, Theirs: theirs, Ours: ours, Age: age}
}
