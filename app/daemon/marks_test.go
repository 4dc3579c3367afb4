package daemon

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
)

// appliedBuffer records the chain ends the aggregator hands to Redis.
type appliedBuffer struct {
	mu   sync.Mutex
	last []cdc.LSN
}

func (b *appliedBuffer) Apply(_ context.Context, _, last cdc.LSN, _ []counter.Move, _ []counter.Delta) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last = append(b.last, last)
	return true, nil
}

func (b *appliedBuffer) applied() []cdc.LSN {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]cdc.LSN(nil), b.last...)
}

// degradingTxn is one transaction whose change finds the source's replica
// identity without the counter's key column: the counter is reported
// degraded, which the daemon marks dirty.
func degradingTxn(begin, end cdc.LSN) []cdc.Event {
	rel := &cdc.Relation{ID: 2, Namespace: "public", Name: "likes", ReplicaIdentity: 'd',
		Columns: []cdc.Column{{Name: "id", Key: true}, {Name: "post_id"}}}
	return []cdc.Event{
		{Kind: cdc.KindBegin, LSN: begin, Xid: 7},
		{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: rel, New: cdc.Tuple{Cols: []cdc.Value{
			{Kind: cdc.ValueText, Data: []byte("1")}, {Kind: cdc.ValueText, Data: []byte("2")}}}},
		{Kind: cdc.KindCommit, LSN: end},
	}
}

// TestMarksDurableBeforeRedis: a dirty mark a transaction causes is
// written before the transaction goes to Redis (a restart skips what
// Redis holds, so the mark could not be made again), the aggregator does
// not write it itself, and a failed write fails the hand-over and every
// later mark, ending the session as the synchronous write did.
func TestMarksDurableBeforeRedis(t *testing.T) {
	t.Parallel()
	d := &Daemon{log: zap.NewNop()}
	entered := make(chan mark, 1)
	release := make(chan error)
	w := newMarkWriter(d, func(_ context.Context, m mark) error {
		entered <- m
		return <-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.run(ctx) }()

	buf := &appliedBuffer{}
	agg := aggregator.New(aggregator.Options{
		Counters: []counter.Counter{{Name: "likes", Source: "public.likes", Key: "post_id"}},
		Buffer:   buf, Marks: w,
	})
	if err := agg.Process(ctx, degradingTxn(10, 20)); err != nil {
		t.Fatalf("process: %v", err)
	}
	// The mark is being written on the writer's goroutine while the
	// aggregator already returned.
	m := <-entered
	if m.counter != "likes" || m.keys != nil {
		t.Fatalf("mark = %+v, want the whole counter likes", m)
	}
	if !d.state.degraded["likes"] {
		t.Fatalf("degraded = %v, want likes recorded at once", d.state.degraded)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- agg.Flush(ctx) }()
	select {
	case err := <-flushed:
		t.Fatalf("the hand-over to Redis returned (%v) before the mark was written; applied %v", err, buf.applied())
	default:
	}
	if got := buf.applied(); len(got) != 0 {
		t.Fatalf("applied %v before the mark was written", got)
	}
	release <- nil
	if err := <-flushed; err != nil {
		t.Fatalf("flush after the mark was written: %v", err)
	}
	if got := buf.applied(); len(got) != 1 || got[0] != 20 {
		t.Fatalf("applied %v, want the transaction ending at 20", got)
	}

	// A write that fails: the hand-over of the transaction that caused
	// the mark fails with the write's error, and nothing goes to Redis.
	agg2 := aggregator.New(aggregator.Options{
		Counters: []counter.Counter{{Name: "likes", Source: "public.likes", Key: "post_id"}},
		Buffer:   buf, Marks: w, Start: 20,
	})
	if err := agg2.Process(ctx, degradingTxn(30, 40)); err != nil {
		t.Fatalf("process: %v", err)
	}
	<-entered
	boom := errors.New("permission denied for table dirty")
	release <- boom
	if err := agg2.Flush(ctx); !errors.Is(err, boom) {
		t.Fatalf("flush after a failed mark: err = %v, want %v", err, boom)
	}
	if err := <-stopped; !errors.Is(err, boom) {
		t.Fatalf("writer: err = %v, want %v (it ends the session)", err, boom)
	}
	if got := buf.applied(); len(got) != 1 {
		t.Fatalf("applied %v after the failed mark, want nothing more", got)
	}
	if err := w.DirtyCounters([]string{"likes"}, "later"); !errors.Is(err, boom) {
		t.Fatalf("a mark after the failure: err = %v, want %v", err, boom)
	}
}
