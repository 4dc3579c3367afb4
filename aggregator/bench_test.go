package aggregator

import (
	"context"
	"strconv"
	"testing"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
)

type discardBuffer struct{}

func (discardBuffer) Apply(context.Context, cdc.LSN, cdc.LSN, []counter.Move, []counter.Delta) (bool, error) {
	return true, nil
}

// BenchmarkProcessInserts measures the aggregator's cost per row change:
// 1000-row transactions over 50 posts, as in the drain benchmark.
func BenchmarkProcessInserts(b *testing.B) {
	a := New(Options{Counters: []counter.Counter{countAll}, Buffer: discardBuffer{}})
	posts := make([]cdc.Value, 50)
	for i := range posts {
		posts[i] = txt(strconv.Itoa(i + 1))
	}
	evs := []cdc.Event{{Kind: cdc.KindBegin}}
	for i := 0; i < 1000; i++ {
		evs = append(evs, cdc.Event{Kind: cdc.KindChange, Op: cdc.OpInsert, Rel: likesRel, New: row(posts[i%50], null, null)})
	}
	evs = append(evs, cdc.Event{Kind: cdc.KindCommit})
	ctx := context.Background()
	b.ReportAllocs()
	lsn := cdc.LSN(1)
	for b.Loop() {
		evs[0].LSN = lsn
		evs[len(evs)-1].LSN = lsn + 1
		lsn += 2
		if err := a.Process(ctx, evs); err != nil {
			b.Fatal(err)
		}
		if err := a.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/row")
}
