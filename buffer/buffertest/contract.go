// Package buffertest is the contract every deployment of walcount's Redis
// buffer must keep: the chain rules of package buffer, run against a real
// server of each topology (a single node, a Cluster, a Sentinel-watched
// primary). Tests of those topologies call Run with a client factory.
package buffertest

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	if _, err := b.Apply(ctx, 10, 20, []counter.Delta{{Field: "c:1", N: 1}}); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("apply without meta: err = %v, want buffer.ErrChainBroken", err)
	}
	if err := b.Reset(ctx, 10); err != nil {
		t.Fatal(err)
	}
	ok, err := b.Apply(ctx, 10, 20, []counter.Delta{{Field: "c:1", N: 2}, {Field: "c:2", N: 1}})
	if err != nil || !ok {
		t.Fatalf("first apply: %v, %v", ok, err)
	}
	// The same batch again (a retried call) changes nothing.
	ok, err = b.Apply(ctx, 10, 20, []counter.Delta{{Field: "c:1", N: 2}, {Field: "c:2", N: 1}})
	if err != nil || ok {
		t.Fatalf("replayed apply: ok=%v err=%v; want ignored", ok, err)
	}
	// A batch that leaves a hole is refused.
	if _, err := b.Apply(ctx, 25, 30, []counter.Delta{{Field: "c:1", N: 1}}); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("apply with a gap: err = %v, want buffer.ErrChainBroken", err)
	}
	// Deltas that cancel out remove the field.
	if _, err := b.Apply(ctx, 20, 30, []counter.Delta{{Field: "c:2", N: -1}}); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.HGetAll(ctx, b.Keys().Buffer).Result()
	if err != nil {
		t.Fatal(err)
	}
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
	if err := b.Reset(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := b.HandOver(ctx, 100); err != nil || ok {
		t.Fatalf("empty hand-over: ok=%v err=%v", ok, err)
	}
	if _, err := b.Apply(ctx, 100, 200, []counter.Delta{{Field: "c:1", N: 5}}); err != nil {
		t.Fatal(err)
	}
	from, upto, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || from != 100 || upto != 200 {
		t.Fatalf("hand-over = %s %s %v %v", from, upto, ok, err)
	}
	// New deltas go to a new buffer while the flush is in progress.
	if _, err := b.Apply(ctx, 200, 300, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	// A second hand-over (a retry after a crash) resumes the same range.
	from2, upto2, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || from2 != 100 || upto2 != 200 {
		t.Fatalf("resumed hand-over = %s %s %v %v", from2, upto2, ok, err)
	}
	fl, err := b.Flushing(ctx)
	if err != nil || fl["c:1"] != "5" {
		t.Fatalf("flushing = %v, %v", fl, err)
	}
	if err := b.Done(ctx, 100, 200); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, b.Keys().Flushing).Result(); n != 0 {
		t.Fatal("flushing still exists after Done")
	}
	from, upto, ok, err = b.HandOver(ctx, 200)
	if err != nil || !ok || from != 200 || upto != 300 {
		t.Fatalf("next hand-over = %s %s %v %v", from, upto, ok, err)
	}
}

func handOverAfterCommitBeforeDone(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 100, 200, []counter.Delta{{Field: "c:1", N: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.HandOver(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 200, 300, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	// PostgreSQL committed (W = 200) but DEL flushing never ran: the
	// next hand-over from W discards the applied batch and goes on.
	from, upto, ok, err := b.HandOver(ctx, 200)
	if err != nil || !ok || from != 200 || upto != 300 {
		t.Fatalf("hand-over = %s %s %v %v", from, upto, ok, err)
	}
	fl, _ := b.Flushing(ctx)
	if fl["c:1"] != "1" {
		t.Fatalf("flushing = %v, want only the new batch", fl)
	}
}

func handOverDetectsForeignChain(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if _, _, _, err := b.HandOver(ctx, 100); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("no meta: err = %v", err)
	}
	if err := b.Reset(ctx, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 50, 80, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.HandOver(ctx, 100); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("buffer starting before W: err = %v, want buffer.ErrChainBroken", err)
	}
}

func advance(t *testing.T, b *buffer.Redis, _ redis.UniversalClient) {
	ctx := context.Background()
	if err := b.Reset(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.Advance(ctx, 10, 40); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.Meta(ctx); m.LSN != 40 || m.Base != 40 {
		t.Fatalf("meta = %+v", m)
	}
	if _, err := b.Apply(ctx, 40, 50, []counter.Delta{{Field: "c:1", N: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Advance(ctx, 50, 60); !errors.Is(err, buffer.ErrChainBroken) {
		t.Fatalf("advance over a non-empty buffer: err = %v", err)
	}
}
