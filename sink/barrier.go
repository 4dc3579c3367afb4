package sink

import (
	"context"

	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
)

// Barrier applies a TRUNCATE: everything buffered before it is flushed,
// then one transaction zeroes the truncated counters, applies the
// transaction's own later deltas and moves W to end (design rule 10).
// The caller must not add to the buffer while Barrier runs.
func (f *Flusher) Barrier(ctx context.Context, end cdc.LSN, reset []string, deltas []counter.Delta) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.flushLocked(ctx); err != nil {
		return err
	}
	var resets []*counter.Resolved
	for _, name := range reset {
		if t := f.targets[name]; t != nil {
			resets = append(resets, t)
		}
	}
	fields := make(map[string]int64, len(deltas))
	for _, d := range deltas {
		fields[d.Field] += d.N
	}
	from := f.w
	if _, err := f.apply(ctx, from, end, fields, nil, resets, false); err != nil {
		return err
	}
	if err := f.opt.Buffer.Advance(ctx, from, end); err != nil {
		return err
	}
	f.committed(end)
	f.log.Info("applied truncate barrier", zap.Strings("counters", reset), zap.String("lsn", end.String()))
	return nil
}
