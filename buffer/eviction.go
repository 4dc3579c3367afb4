package buffer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Eviction is what Redis would do with walcount's keys under memory
// pressure: its maxmemory and maxmemory-policy.
type Eviction struct {
	// Policy is maxmemory-policy: noeviction, allkeys-lru, volatile-ttl...
	Policy string
	// MaxMemory is maxmemory in bytes; 0 means no limit.
	MaxMemory int64
}

// ReadEviction reads the eviction settings. Managed Redis services often
// refuse CONFIG; the error says so and the caller reports nothing. On a
// Cluster it reads every master and returns the riskiest, since any of them
// may hold walcount's keys after a resharding or a failover.
func ReadEviction(ctx context.Context, rdb redis.UniversalClient) (Eviction, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return readEviction(ctx, rdb)
	}
	var mu sync.Mutex
	var worst *Eviction
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		e, err := readEviction(ctx, node)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if worst == nil || e.risk() > worst.risk() {
			worst = &e
		}
		return nil
	})
	if err != nil {
		return Eviction{}, err
	}
	if worst == nil {
		return Eviction{Policy: "noeviction"}, nil
	}
	return *worst, nil
}

// risk orders settings from harmless (0) to evicting now (2).
func (e Eviction) risk() int {
	switch {
	case !e.Risky():
		return 0
	case !e.Limited():
		return 1
	}
	return 2
}

func readEviction(ctx context.Context, rdb redis.Cmdable) (Eviction, error) {
	cfg, err := rdb.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return Eviction{}, fmt.Errorf("read redis maxmemory settings: %w", err)
	}
	e := Eviction{Policy: cfg["maxmemory-policy"]}
	if v := cfg["maxmemory"]; v != "" {
		if e.MaxMemory, err = strconv.ParseInt(v, 10, 64); err != nil {
			return Eviction{}, fmt.Errorf("read redis maxmemory: %q: %w", v, err)
		}
	}
	return e, nil
}

// Risky reports whether the policy may evict walcount's keys: any
// allkeys-* policy, and the volatile-* ones, which do not evict keys
// without a TTL (walcount's have none) but, with nothing left to evict,
// refuse the writes walcount needs.
func (e Eviction) Risky() bool {
	return strings.HasPrefix(e.Policy, "allkeys-") || strings.HasPrefix(e.Policy, "volatile-")
}

// Limited reports whether a maxmemory limit is set, which makes a risky
// policy act.
func (e Eviction) Limited() bool { return e.MaxMemory > 0 }

// Fix is the setting that takes the risk away.
const EvictionFix = "CONFIG SET maxmemory-policy noeviction (and the same in redis.conf), or give walcount a Redis of its own"

// String says what the settings mean for walcount.
func (e Eviction) String() string {
	switch {
	case !e.Risky():
		return fmt.Sprintf("maxmemory-policy %s: walcount's keys are never evicted", e.Policy)
	case e.Limited():
		return fmt.Sprintf("maxmemory-policy %s with maxmemory %d bytes: under memory pressure Redis evicts keys or refuses writes; "+
			"walcount detects a lost key and replays from its checkpoint, but counts stop moving while it does", e.Policy, e.MaxMemory)
	default:
		return fmt.Sprintf("maxmemory-policy %s: harmless while maxmemory is 0 (no limit), but walcount's keys would be evicted once a limit is set", e.Policy)
	}
}
