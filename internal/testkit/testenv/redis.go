package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// Leasing of database indexes on a shared Redis server.
const (
	// leaseKeyPrefix, followed by the index, names a lease key in DB 0.
	leaseKeyPrefix = "walcount:testenv:lease:"
	// firstLeasedDB and lastLeasedDB bound the indexes given to tests; DB 0
	// holds the leases.
	firstLeasedDB = 1
	lastLeasedDB  = 15
	// leaseTTL outlives any test (the suite's timeout is 40 minutes); a
	// lease of a killed test binary expires by itself.
	leaseTTL = time.Hour
	// leaseWait is how long RedisURL waits for a free index.
	leaseWait = 5 * time.Minute
)

// releaseScript deletes a lease only if it still holds the caller's token.
var releaseScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("DEL", KEYS[1])
end
return 0`)

// RedisURL returns the URL of an empty Redis database that belongs to the
// test alone. With the local binary it is a fresh redis-server per call
// (about 20 ms), closed when the test ends. With WALCOUNT_TEST_REDIS_URL, or
// a Docker container shared by the test binary, it is one of the database
// indexes 1..15, leased through a key in DB 0, flushed before and after.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvRedisURL); u != "" {
		return leaseRedisDB(tb, u)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	r, err := servers.StartRedis(ctx, servers.RedisOptions{})
	if err == nil {
		tb.Cleanup(func() {
			if err := r.Close(); err != nil {
				tb.Errorf("testenv: close redis: %v", err)
			}
		})
		return r.URL()
	}
	if !errors.Is(err, servers.ErrNoRedis) {
		tb.Fatalf("testenv: %v", err)
	}
	base, err2 := sharedDockerRedis()
	if err2 != nil {
		tb.Fatalf("testenv: %v; %v\n(to run walcount's tests, %s)", err, err2, installHint)
	}
	return leaseRedisDB(tb, base)
}

// sharedDockerRedis returns the URL of a redis container shared by the test
// binary, starting it on first use.
func sharedDockerRedis() (string, error) {
	shared.redisOnce.Do(func() {
		if chooseSource("", false, dockerReachable) != sourceDocker {
			shared.redisErr = errors.New("no Docker engine answers either")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		shared.redisURL, shared.redisClose, shared.redisErr = startRedisContainer(ctx)
	})
	return shared.redisURL, shared.redisErr
}

// leaseRedisDB leases a free database index on the server at base for the
// rest of the test, flushes it and returns its URL.
func leaseRedisDB(tb testing.TB, base string) string {
	tb.Helper()
	opt, err := redis.ParseURL(base)
	if err != nil {
		tb.Fatalf("testenv: parse %s %q: %v", EnvRedisURL, redact(base), err)
	}
	opt.DB = 0
	admin := redis.NewClient(opt)
	defer admin.Close()

	ctx, cancel := context.WithTimeout(context.Background(), leaseWait)
	defer cancel()
	token := randomHex(8)
	db, err := acquireLease(ctx, admin, token)
	if err != nil {
		tb.Fatalf("testenv: lease a redis database on %s: %v", redact(base), err)
	}
	if err := flushDB(ctx, opt, db); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		err := flushDB(ctx, opt, db)
		admin := redis.NewClient(opt)
		defer admin.Close()
		if rerr := releaseScript.Run(ctx, admin, []string{leaseKey(db)}, token).Err(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("release lease of redis database %d: %w", db, rerr))
		}
		if err != nil {
			tb.Errorf("testenv: %v", err)
		}
	})
	u, err := withPath(base, "/"+strconv.Itoa(db))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return u
}

// acquireLease takes the first free index in firstLeasedDB..lastLeasedDB,
// waiting for one to be released while ctx allows.
func acquireLease(ctx context.Context, admin *redis.Client, token string) (int, error) {
	for {
		for db := firstLeasedDB; db <= lastLeasedDB; db++ {
			ok, err := admin.SetNX(ctx, leaseKey(db), token, leaseTTL).Result()
			if err != nil {
				return 0, fmt.Errorf("set lease key: %w", err)
			}
			if ok {
				return db, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("all of databases %d..%d are leased: %w", firstLeasedDB, lastLeasedDB, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// flushDB empties database db of the server in opt.
func flushDB(ctx context.Context, opt *redis.Options, db int) error {
	o := *opt
	o.DB = db
	c := redis.NewClient(&o)
	defer c.Close()
	if err := c.FlushDB(ctx).Err(); err != nil {
		return fmt.Errorf("flush redis database %d: %w", db, err)
	}
	return nil
}

// leaseKey names the lease of database db.
func leaseKey(db int) string {
	return leaseKeyPrefix + strconv.Itoa(db)
}
