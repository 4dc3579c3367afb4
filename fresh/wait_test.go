package fresh

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestWaitNudgesOnlyWhatTheStreamHasNotReceived: a read waiting for an
// LSN that the stream has received already waits for the aggregator's
// hand-over to Redis, which a heartbeat would not make sooner: none is
// emitted for it. A read waiting for an LSN the stream has not received
// gets one heartbeat (a quiet database makes no WAL of its own).
func TestWaitNudgesOnlyWhatTheStreamHasNotReceived(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	buf := buffer.New(rdb, "wait")
	ctx := context.Background()
	const tip = LSN(1000)
	if err := buf.Reset(ctx, tip, "test/1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		received LSN
		emits    int64
	}{
		{"received by the stream", 2000, 0},
		{"not received yet", 1200, 1},
		{"no stream in this process", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var emits atomic.Int64
			w := newWatcher(buf, func(context.Context) (LSN, error) {
				emits.Add(1)
				return 0, errors.New("the heartbeat is not written: the chain must not move")
			}, func() LSN { return tc.received }, zap.NewNop(), metrics.New())
			// Many times nudgeAfter, and the chain never reaches 1500: the
			// wait times out either way.
			wctx, cancel := context.WithTimeout(ctx, 25*nudgeAfter)
			defer cancel()
			got, err := w.waitFor(wctx, 1500)
			if !errors.Is(err, context.DeadlineExceeded) || got != tip {
				t.Fatalf("waitFor = %v, %v; want the tip %v and a time-out", got, err, tip)
			}
			if n := emits.Load(); n < tc.emits || (tc.emits == 0 && n != 0) {
				t.Errorf("%d heartbeats emitted, want %d", n, tc.emits)
			}
		})
	}
}
