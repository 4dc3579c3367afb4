package preflight

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
)

// redisTimeout bounds each Redis check: an address that drops packets must
// not hang `walcount check`.
const redisTimeout = 3 * time.Second

// checkRedis checks that Redis answers, accepts writes (a replica or a full
// noeviction instance does not) and does not evict walcount's keys.
// walcount's keys carry no TTL, so only the allkeys-* policies can evict
// them; an evicted buffer is survivable (DESIGN §2 rule 7) but costs a
// replay from W each time.
func (r *run) checkRedis() {
	opts, err := redis.ParseURL(r.cfg.RedisURL)
	if err != nil {
		// The error may quote the URL, password included; say only what
		// is wrong with it.
		r.problem(CheckRedis, "the Redis URL cannot be parsed", "set --redis-url to redis://[user:password@]host:port/db")
		return
	}
	opts.DialTimeout = redisTimeout
	opts.ReadTimeout = redisTimeout
	opts.WriteTimeout = redisTimeout
	opts.MaxRetries = -1 // one attempt: a check reports, it does not wait
	opts.DialerRetries = 1
	opts.DisableIdentity = true
	client := redis.NewClient(opts)
	defer client.Close()

	ctx, cancel := context.WithTimeout(r.ctx, 3*redisTimeout)
	defer cancel()
	addr := opts.Addr
	if err := client.Ping(ctx).Err(); err != nil {
		r.problem(CheckRedis, fmt.Sprintf("Redis at %s does not answer PING: %v", addr, err),
			"start Redis, or set --redis-url (or WALCOUNT_REDIS_URL) to a reachable Redis")
		return
	}
	r.ok(CheckRedis, fmt.Sprintf("Redis at %s answers PING", addr))

	// The key shares the hash tag of walcount's other keys (DESIGN §2
	// rule 6), so on a cluster it lands on the node that holds them.
	key := "walcount:{" + r.cfg.Slot + "}:check"
	value := strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := client.Set(ctx, key, value, 10*time.Second).Err(); err != nil {
		r.problem(CheckRedisWritable, fmt.Sprintf("Redis at %s does not accept writes: %v", addr, err),
			"point --redis-url at a writable primary with free memory")
		return
	}
	if err := client.Del(ctx, key).Err(); err != nil {
		r.problem(CheckRedisWritable, fmt.Sprintf("Redis at %s accepted a write but not its deletion: %v", addr, err), "")
		return
	}
	r.ok(CheckRedisWritable, fmt.Sprintf("Redis at %s accepts writes", addr))

	// Managed Redis services often disable CONFIG; then nothing is said.
	ev, err := buffer.ReadEviction(ctx, client)
	if err != nil {
		r.log.Debug("cannot read Redis maxmemory settings", zap.Error(err))
		return
	}
	switch {
	case ev.Risky() && ev.Limited():
		// Every eviction of a walcount key costs a replay from W, and a
		// Redis that keeps evicting keeps walcount from moving W at all.
		r.problem(CheckRedisEviction, fmt.Sprintf("Redis at %s: %s", addr, ev), buffer.EvictionFix)
	case ev.Risky():
		r.warn(CheckRedisEviction, fmt.Sprintf("Redis at %s: %s", addr, ev), buffer.EvictionFix)
	default:
		r.ok(CheckRedisEviction, fmt.Sprintf("Redis at %s: %s", addr, ev))
	}
}
