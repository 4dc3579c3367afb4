// Package buffertest is the contract every deployment of walcount's Redis
// buffer must keep: the chain rules of package buffer, run against a real
// server of each topology (a single node, a Cluster, a Sentinel-watched
// primary). Tests of those topologies call Run with a client factory.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
package buffertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
)

// Client returns a client of an empty Redis (or an empty slot's keys on a
// shared one) for one subtest; the suite closes nothing it did not open.
type Client func(t *testing.T) redis.UniversalClient

// Run runs every contract test against buffers made on clients from
// client. Each subtest uses its own slot name, so one server may serve
// them all.
func Run(t *testing.T, client Client) {
	tests := []struct {
		name string
		fn   func(*testing.T, *buffer.Redis, redis.UniversalClient)
	}{
		{"ApplyIsIdempotentAndChained", applyIsIdempotentAndChained},
		{"HandOverResumeAndDone", handOverResumeAndDone},
		{"HandOverAfterCommitBeforeDone", handOverAfterCommitBeforeDone},
		{"HandOverDetectsForeignChain", handOverDetectsForeignChain},
		{"Advance", advance},
		{"LostBufferIsDetected", lostBufferIsDetected},
		{"LostFlushingIsDetected", lostFlushingIsDetected},
		{"StaleHashOfAnEarlierChain", staleHashOfAnEarlierChain},
		{"MovesRunBeforeTheBatch", movesRunBeforeTheBatch},
		{"EmptyDeltasStillStamp", emptyDeltasStillStamp},
		{"HandOverIsPaged", handOverIsPaged},
		{"ApplyInPartsInterrupted", applyInPartsInterrupted},
		{"SpillBeforeCommit", spillBeforeCommit},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb := client(t)
			slot := fmt.Sprintf("contract_%d_%d", os.Getpid(), i)
			b := buffer.New(rdb, slot)
			t.Cleanup(func() { _ = b.Drop(context.Background()) })
			tt.fn(t, b, rdb)
		})
	}
}

func applyIsIdempotentAndChained(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if _, err := b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 1}}); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("apply without meta: err = %v, want buffer.ErrChainBroken", err)
	}
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	ok, err := b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 2}, {Field: "c:2", N: 1}})
	if err != nil || !ok {
		t.Fatalf("first apply: %v, %v", ok, err)
	}
	// The same batch again (a retried call) changes nothing.
	ok, err = b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 2}, {Field: "c:2", N: 1}})
	if err != nil || ok {
		t.Fatalf("replayed apply: ok=%v err=%v; want ignored", ok, err)
	}
	// A batch that leaves a hole is refused.
	if _, err := b.Apply(ctx, 25, 30, nil, []counter.Delta{{Field: "c:1", N: 1}}); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("apply with a gap: err = %v, want buffer.ErrChainBroken", err)
	}
	// Deltas that cancel out remove the field.
	if _, err := b.Apply(ctx, 20, 30, nil, []counter.Delta{{Field: "c:2", N: -1}}); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.HGetAll(ctx, b.Keys().Buffer).Result()
	if err != nil {
		t.Fatal(err)
	}
	delete(got, buffer.StampField)
	if len(got) != 1 || got["c:1"] != "2" {
		t.Fatalf("buffer = %v, want c:1=2 only", got)
	}
	m, err := b.Meta(ctx)
	if err != nil || m.LSN != 30 || m.Base != 10 || m.Flushing {
		t.Fatalf("meta = %+v, %v", m, err)
	}
}

func handOverResumeAndDone(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 100, "history"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.HandOver(ctx, 100); err != nil || ok {
		t.Fatalf("empty hand-over: ok=%v err=%v", ok, err)
	}
	if _, err := b.Apply(ctx, 100, 200, nil, []counter.Delta{{Field: "c:1", N: 5}}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || got.From != 100 || got.Upto != 200 || got.Deltas["c:1"] != 5 || len(got.Deltas) != 1 {
		t.Fatalf("hand-over = %+v %v %v", got, ok, err)
	}
	// New deltas go to a new buffer while the flush is in progress.
	if _, err := b.Apply(ctx, 200, 300, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	// A second hand-over (a retry after a crash) resumes the same range.
	again, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || again.From != 100 || again.Upto != 200 || again.Deltas["c:1"] != 5 {
		t.Fatalf("resumed hand-over = %+v %v %v", again, ok, err)
	}
	if err := b.Done(ctx, 100, 200); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, b.Keys().Flushing).Result(); n != 0 {
		t.Fatal("flushing still exists after Done")
	}
	next, ok, err := b.HandOver(ctx, 200)
	if err != nil || !ok || next.From != 200 || next.Upto != 300 {
		t.Fatalf("next hand-over = %+v %v %v", next, ok, err)
	}
}

func handOverAfterCommitBeforeDone(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 100, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 100, 200, nil, []counter.Delta{{Field: "c:1", N: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.HandOver(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 200, 300, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	// PostgreSQL committed (W = 200) but DEL flushing never ran: the
	// next hand-over from W discards the applied batch and goes on.
	got, ok, err := b.HandOver(ctx, 200)
	if err != nil || !ok || got.From != 200 || got.Upto != 300 {
		t.Fatalf("hand-over = %+v %v %v", got, ok, err)
	}
	if got.Deltas["c:1"] != 1 {
		t.Fatalf("flushing = %v, want only the new batch", got.Deltas)
	}
}

func handOverDetectsForeignChain(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if _, _, err := b.HandOver(ctx, 100); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("no meta: err = %v", err)
	}
	if err := b.Reset(ctx, 50, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 50, 80, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.HandOver(ctx, 100); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("buffer starting before W: err = %v, want buffer.ErrChainBroken", err)
	}
}

func advance(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if err := b.Advance(ctx, 10, 40); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.Meta(ctx); m.LSN != 40 || m.Base != 40 {
		t.Fatalf("meta = %+v", m)
	}
	if _, err := b.Apply(ctx, 40, 50, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Advance(ctx, 50, 60); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("advance over a non-empty buffer: err = %v", err)
	}
}

// lostBufferIsDetected: a deleted buffer hash is a loss, whether the next
// write or the next hand-over meets it; HINCRBY must not quietly recreate
// it and a hand-over must not read it as empty (design rule 13).
func lostBufferIsDetected(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, b.Keys().Buffer).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 20, 30, nil, []counter.Delta{{Field: "c:1", N: 1}}); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("apply after the buffer was deleted: err = %v, want ErrChainBroken", err)
	}
	if _, _, err := b.HandOver(ctx, 10); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("hand-over after the buffer was deleted: err = %v, want ErrChainBroken", err)
	}
}

// lostFlushingIsDetected: a flush in progress whose hash is gone cannot
// be resumed as an empty one, which would move W past its deltas.
func lostFlushingIsDetected(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 100}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.HandOver(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, b.Keys().Flushing).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.HandOver(ctx, 10); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("resumed hand-over of a deleted flushing hash: err = %v, want ErrChainBroken", err)
	}
}

// staleHashOfAnEarlierChain: after a reset, a buffer hash of the earlier
// chain (put back by a failover to an old replica, say) does not pass for
// this chain's, even at the same LSNs.
func staleHashOfAnEarlierChain(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 7}}); err != nil {
		t.Fatal(err)
	}
	old, err := rdb.HGetAll(ctx, b.Keys().Buffer).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, b.Keys().Buffer, old).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, b.Keys().Meta, "lsn", buffer.FormatLSN(20)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.HandOver(ctx, 10); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("hand-over of an earlier chain's hash: err = %v, want ErrChainBroken", err)
	}
}

// movesRunBeforeTheBatch: a move takes a buffered delta to another field
// and a drop removes it, before the batch's own deltas are added.
func movesRunBeforeTheBatch(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 10, 20, nil, []counter.Delta{{Field: "c:1", N: 4}, {Field: "c:2", N: 6}, {Field: "c:3", N: 1}}); err != nil {
		t.Fatal(err)
	}
	moves := []counter.Move{{Field: "c:1", To: ""}, {Field: "c:2", To: "c:20"}, {Field: "c:3", To: "c:30"}, {Field: "c:9", To: "c:90"}}
	if _, err := b.Apply(ctx, 20, 30, moves, []counter.Delta{{Field: "c:1", N: 2}, {Field: "c:30", N: -1}}); err != nil {
		t.Fatal(err)
	}
	later := []counter.Move{{Field: "c:20", To: "c:200"}, {Field: "c:\"x\"/é", To: ""}}
	if _, err := b.Apply(ctx, 30, 40, later, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Len(ctx); err != nil || n != 2 {
		t.Fatalf("Len = %d, %v; want 2 (the recorded moves are not deltas)", n, err)
	}
	got, ok, err := b.HandOver(ctx, 10)
	if err != nil || !ok {
		t.Fatalf("hand-over: %v %v", ok, err)
	}
	want := map[string]int64{"c:1": 2, "c:200": 6}
	if len(got.Deltas) != len(want) || got.Deltas["c:1"] != 2 || got.Deltas["c:200"] != 6 {
		t.Fatalf("deltas = %v, want %v", got.Deltas, want)
	}
	// The flusher runs the moves, in stream order, on what it carried.
	if wantMoves := append(moves, later...); !slices.Equal(got.Moves, wantMoves) {
		t.Fatalf("moves = %v, want %v", got.Moves, wantMoves)
	}
}

// emptyDeltasStillStamp: a batch whose deltas cancel out (or a heartbeat
// with none) still moves the chain, and the hand-over that follows is an
// empty flush, not a loss.
func emptyDeltasStillStamp(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 10, 20, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 20, 30, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 30, 40, nil, []counter.Delta{{Field: "c:1", N: -1}}); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Len(ctx); err != nil || n != 0 {
		t.Fatalf("Len = %d, %v; want 0 (the stamp is not a delta)", n, err)
	}
	got, ok, err := b.HandOver(ctx, 10)
	if err != nil || !ok || got.Upto != 40 || len(got.Deltas) != 0 {
		t.Fatalf("hand-over = %+v %v %v; want an empty flush up to 0/28", got, ok, err)
	}
}

// replySizes is a go-redis hook that records, while on, the largest reply
// (in values) of any command on the buffer's keys.
type replySizes struct {
	on  atomic.Bool
	mu  sync.Mutex
	max map[string]int
}

func (h *replySizes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replySizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *replySizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if !h.on.Load() {
			return err
		}
		n := 0
		switch c := cmd.(type) {
		case *redis.Cmd:
			if v, ok := c.Val().([]any); ok {
				n = len(v)
			}
		case *redis.StringSliceCmd:
			n = len(c.Val())
		case *redis.ScanCmd:
			keys, _ := c.Val()
			n = len(keys)
		case *redis.MapStringStringCmd:
			n = 2 * len(c.Val())
		}
		h.mu.Lock()
		h.max[cmd.Name()] = max(h.max[cmd.Name()], n)
		h.max[cmd.Name()+" args"] = max(h.max[cmd.Name()+" args"], len(cmd.Args()))
		h.mu.Unlock()
		return err
	}
}

// handOverIsPaged: a batch of many keys is handed over by a script whose
// reply does not grow with it, and read in pages of bounded size (issue
// 26: one reply of 2 million fields outlived the client's read timeout and
// kept Redis busy for everyone).
func handOverIsPaged(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 100, "history"); err != nil {
		t.Fatal(err)
	}
	const keys = 30000
	hook := &replySizes{max: map[string]int{}}
	rdb.AddHook(hook)
	hook.on.Store(true)
	defer hook.on.Store(false)
	// One transaction of 30,000 keys: written in parts.
	ds := make([]counter.Delta, keys)
	for j := range ds {
		ds[j] = counter.Delta{Field: fmt.Sprintf("c:%d", j), N: int64(j + 1)}
	}
	if ok, err := b.Apply(ctx, 100, 101, nil, ds); err != nil || !ok {
		t.Fatalf("apply: %v %v", ok, err)
	}
	// Again (a replay): nothing is added twice.
	if ok, err := b.Apply(ctx, 100, 101, nil, ds); err != nil || ok {
		t.Fatalf("apply again: %v %v", ok, err)
	}
	if _, err := b.Apply(ctx, 101, 102, []counter.Move{{Field: "c:0", To: "c:999999"}}, nil); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.HandOver(ctx, 100)
	hook.on.Store(false)
	if err != nil || !ok || got.Upto != 102 {
		t.Fatalf("hand-over: ok=%v err=%v upto=%v", ok, err, got.Upto)
	}
	if len(got.Deltas) != keys {
		t.Fatalf("hand-over read %d deltas, want %d", len(got.Deltas), keys)
	}
	for i := 1; i < keys; i++ {
		if got.Deltas[fmt.Sprintf("c:%d", i)] != int64(i+1) {
			t.Fatalf("c:%d = %d, want %d", i, got.Deltas[fmt.Sprintf("c:%d", i)], i+1)
		}
	}
	if got.Deltas["c:999999"] != 1 || len(got.Moves) != 1 {
		t.Fatalf("moved delta = %d, moves = %v", got.Deltas["c:999999"], got.Moves)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	for name, n := range hook.max {
		// A page of HSCAN holds about its COUNT fields (twice as many
		// values), a few more where buckets collide; a script call
		// carries at most MaxApplyFields deltas.
		if n > max(4*buffer.DefaultScanPage, 2*buffer.MaxApplyFields+16) {
			t.Errorf("%s: %d values for a batch of %d keys: the writes and the hand-over are not in bounded pieces", name, n, keys)
		}
	}
	if hook.max["hscan"] == 0 {
		t.Errorf("no HSCAN page read: %v", hook.max)
	}
}

// applyInPartsInterrupted: a batch written in parts that was cut off
// (meta.part left set) is never handed over, and the next batch's write
// reports the broken chain.
func applyInPartsInterrupted(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 100, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 100, 101, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	// Part 1 of the batch (101, 102] was written, part 2 never was.
	if err := rdb.HSet(ctx, b.Keys().Meta, "part", buffer.FormatLSN(102)+"/1").Err(); err != nil {
		t.Fatal(err)
	}
	if m, err := b.Meta(ctx); err != nil || m.Part == "" {
		t.Fatalf("meta = %+v, %v; want its part", m, err)
	}
	if _, ok, err := b.HandOver(ctx, 100); err != nil || ok {
		t.Fatalf("hand-over during a write in parts: ok=%v err=%v, want nothing handed over", ok, err)
	}
	if _, err := b.Apply(ctx, 101, 103, nil, []counter.Delta{{Field: "c:1", N: 1}}); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("apply after an interrupted write in parts: %v, want buffer.ErrChainBroken", err)
	}
}

// spillBeforeCommit: a transaction written in parts before its COMMIT
// (Spill, tagged with its commit record's place) is no part of the chain
// until ApplyAfter: no hand-over takes it meanwhile, a retried part is
// ignored, and the end moves the chain to the transaction's end with every
// part's deltas and the moves run on them.
func spillBeforeCommit(t *testing.T, b *buffer.Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 100, "history"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 100, 101, nil, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	part := make([]counter.Delta, 0, buffer.MaxApplyFields+1)
	for i := range buffer.MaxApplyFields + 1 {
		part = append(part, counter.Delta{Field: fmt.Sprintf("c:%d", i+1), N: 1})
	}
	done, err := b.Spill(ctx, 101, 150, 0, part)
	if err != nil || done != 2 {
		t.Fatalf("spill: %d parts, %v; want 2", done, err)
	}
	if m, err := b.Meta(ctx); err != nil || m.Part == "" || m.LSN != 101 {
		t.Fatalf("meta after a spill = %+v, %v; want its part, lsn still 101", m, err)
	}
	if _, ok, err := b.HandOver(ctx, 100); err != nil || ok {
		t.Fatalf("hand-over during a spill: ok=%v err=%v, want nothing handed over", ok, err)
	}
	// The second part's call again (a retry): ignored.
	if _, err := b.Spill(ctx, 101, 150, 1, part[buffer.MaxApplyFields:]); err != nil {
		t.Fatalf("retried part: %v", err)
	}
	done, err = b.Spill(ctx, 101, 150, done, []counter.Delta{{Field: "c:2", N: 5}})
	if err != nil || done != 3 {
		t.Fatalf("spill: %d parts, %v; want 3", done, err)
	}
	moves := []counter.Move{{Field: "c:3", To: ""}}
	if _, err := b.ApplyAfter(ctx, 101, 160, 150, done, moves, []counter.Delta{{Field: "c:3", N: 7}}); err != nil {
		t.Fatal(err)
	}
	if m, err := b.Meta(ctx); err != nil || m.Part != "" || m.LSN != 160 {
		t.Fatalf("meta after the commit = %+v, %v; want no part, lsn 160", m, err)
	}
	got, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || got.Upto != 160 {
		t.Fatalf("hand-over = %+v %v %v", got.Upto, ok, err)
	}
	want := map[string]int64{"c:1": 2, "c:2": 6, "c:3": 7}
	for f, n := range want {
		if got.Deltas[f] != n {
			t.Errorf("%s = %d, want %d", f, got.Deltas[f], n)
		}
	}
	if len(got.Deltas) != buffer.MaxApplyFields+1 {
		t.Errorf("%d deltas, want %d", len(got.Deltas), buffer.MaxApplyFields+1)
	}
}
