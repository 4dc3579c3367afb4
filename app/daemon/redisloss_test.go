package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/failpoint"
)

// TestBufferKeyDeletedUnderLoad deletes the Redis buffer key several times
// while likes stream in. A deleted hash must not read as an empty one: the
// loss is detected and the chain replayed from W.
func TestBufferKeyDeletedUnderLoad(t *testing.T) {
	t.Parallel()
	underDisruption(t, 4, 400, func(e *env, w *workload) {
		rdb := e.rdb()
		keys := buffer.KeysFor(e.cfg.Slot)
		for i := 0; i < 4; i++ {
			w.waitOps(t, 120)
			if err := rdb.Del(context.Background(), keys.Buffer).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestFlushingKeyDeletedWhileFlushBlocked: a flush has handed the buffer
// over and waits before its commit (a row lock on a hot post); walcount
// dies there, and the "flushing" key is deleted before it comes back. The
// next flush must not commit the checkpoint past deltas it no longer has.
func TestFlushingKeyDeletedWhileFlushBlocked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	fp := &failpoint.Set{}
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fp.Arm(failpoint.BeforeCommit, func() error {
		once.Do(func() { close(blocked) })
		<-release
		return fmt.Errorf("%w: killed while the flush waited", failpoint.ErrCrash)
	})
	d := e.start(func(o *Options) { o.Failpoints = fp })
	if _, err := e.db.Exec(ctx, "INSERT INTO likes (post_id) SELECT 5 FROM generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocked:
	case <-time.After(time.Minute):
		t.Fatal("no flush reached its commit")
	}
	if err := e.rdb().Del(ctx, buffer.KeysFor(e.cfg.Slot).Flushing).Err(); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := d.wait(t, time.Minute); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("daemon returned %v, want the simulated crash", err)
	}
	d2 := e.start()
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d2.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestEvictingRedisUnderLoad runs walcount against a Redis that evicts
// random keys under memory pressure while another client fills it: any
// walcount key it evicts is a loss the chain must detect.
func TestEvictingRedisUnderLoad(t *testing.T) {
	t.Parallel()
	underDisruption(t, 4, 400, func(e *env, _ *workload) {
		ctx := context.Background()
		rdb := e.rdb()
		for _, kv := range [][2]string{{"maxmemory", "4mb"}, {"maxmemory-policy", "allkeys-random"}} {
			if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// /status names the risk and the fix.
		if st := e.last.d.Status(ctx); !strings.Contains(st.RedisEviction, "allkeys-random") || !strings.Contains(st.RedisEviction, "noeviction") {
			t.Errorf("/status redis_eviction = %q, want the policy and the fix", st.RedisEviction)
		}
		filler := strings.Repeat("x", 4096)
		deadline := time.Now().Add(2 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			if err := rdb.Set(ctx, fmt.Sprintf("filler:%d", i), filler, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		evicted, err := rdb.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(evicted, "\r\n") {
			if strings.HasPrefix(line, "evicted_keys:") {
				t.Logf("redis %s", line)
			}
		}
		// Back to a Redis that keeps what it holds, so the test can end.
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
	})
}
