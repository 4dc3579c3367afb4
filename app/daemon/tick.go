package daemon

import (
	"context"
	"time"
)

// everyTick calls fn every interval, the first time one interval from now,
// until ctx is done (it then returns nil) or fn returns an error (which it
// returns). The session's watchers, the heartbeat, the via collection and
// the watch of the targets' row-level security run on it.
func everyTick(ctx context.Context, interval time.Duration, fn func() error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := fn(); err != nil {
			return err
		}
	}
}
