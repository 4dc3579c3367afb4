package sink

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/events"
	"github.com/walcount/walcount/internal/failpoint"
)

// eventsDue runs in a flush transaction (or a piece) before its commit:
// the keys it changed (applied to a row; not the dropped ones, which have
// none) go to the change events' outbox in Redis, and their values are
// read in the transaction's snapshot, exact at lsn, the W it commits (a
// piece's: the W it keeps). A crash after the commit leaves them in the
// outbox for the next session start (events.Publisher.Recover), so the
// events of a committed transaction are published at least once
// (docs/design.md §7, "Change events").
func (f *Flusher) eventsDue(ctx context.Context, tx pgx.Tx, lsn cdc.LSN, out *outcome, resets []*counter.Resolved) (events.Batch, error) {
	if f.opt.Events == nil {
		return events.Batch{}, nil
	}
	fields := make([]string, 0, len(out.applied))
	for field := range out.applied {
		if !out.missed[field] {
			fields = append(fields, field)
		}
	}
	slices.Sort(fields)
	var names []string
	for _, t := range resets {
		names = append(names, t.Counter.Name)
	}
	members, err := f.opt.Events.Due(ctx, fields, names)
	if err != nil || len(members) == 0 {
		return events.Batch{}, err
	}
	return f.opt.Events.Read(ctx, tx, f.targets, members, lsn)
}

// publishEvents publishes the events of a transaction that committed.
func (f *Flusher) publishEvents(ctx context.Context, b events.Batch) error {
	if b.Empty() {
		return nil
	}
	if err := f.opt.Failpoints.Inject(failpoint.BeforeEvents); err != nil {
		return err
	}
	return f.opt.Events.Publish(ctx, b)
}

// RecoverEvents publishes the change events a crash may have kept from
// Redis: the keys still in the outbox, their values read back from the
// target rows at W (events.Publisher.Recover). Call it at a session start,
// before the first flush. It returns the entries published.
func (f *Flusher) RecoverEvents(ctx context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opt.Events.Recover(ctx, f.opt.Pool, f.targets)
}
