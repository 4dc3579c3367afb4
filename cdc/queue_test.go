package cdc

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestQueueIsBoundedByBytes: a batch of wide rows waits until the batches
// ahead of it are released, however many batch slots the queue has left;
// one batch larger than the whole budget still goes when nothing is queued.
func TestQueueIsBoundedByBytes(t *testing.T) {
	s := &Stream{
		cfg:      StreamConfig{QueueSize: 64, QueueBytes: 1 << 20, StatusInterval: time.Hour},
		log:      zap.NewNop(),
		out:      make(chan *Batch, 64),
		released: make(chan struct{}, 1),
	}
	wide := func() *Batch {
		b := s.newBatch()
		b.arena = make([]byte, 700<<10) // 700 KiB of column text
		b.Events = append(b.Events, Event{Kind: KindCommit})
		return b
	}
	ctx := context.Background()
	if _, err := s.handOver(ctx, wide()); err != nil {
		t.Fatal(err)
	}
	if got := s.QueueBytes(); got < 700<<10 {
		t.Fatalf("QueueBytes = %d after one wide batch", got)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := s.handOver(ctx, wide()); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
		t.Fatal("a second wide batch was queued beyond the byte budget")
	case <-time.After(100 * time.Millisecond):
	}
	s.Release(<-s.out)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second batch was not handed over after the first was released")
	}
	s.Release(<-s.out)
	if got := s.QueueBytes(); got != 0 {
		t.Fatalf("QueueBytes = %d after every batch was released", got)
	}

	// Larger than the budget, but alone: it goes.
	huge := s.newBatch()
	huge.arena = make([]byte, 3<<20)
	if _, err := s.handOver(ctx, huge); err != nil {
		t.Fatal(err)
	}
	s.Release(<-s.out)
}
