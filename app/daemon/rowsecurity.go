package daemon

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
)

// watchTargetViews checks, every slot poll interval while this daemon
// streams, that row-level security still lets walcount's role see every
// row of every counter's target, as a session's start does: a policy
// enabled while a session runs would make the flush take the rows it hides
// for deleted ones. A target found hidden stops the daemon (stop, with the
// error and its fix) without waiting for a restart. The flush itself runs
// with row_security = off where no policy applied at the session's start,
// so that it fails rather than drop a hidden row's deltas before this
// check comes round.
func (d *Daemon) watchTargetViews(ctx context.Context, stop context.CancelCauseFunc) {
	_ = everyTick(ctx, d.cfg.SlotSettings.PollInterval, func() error {
		if !d.streaming() {
			return nil
		}
		for _, c := range d.cfg.Counters {
			cctx, cancel := context.WithTimeout(ctx, sampleTimeout)
			err := counter.CheckTargetView(cctx, d.pool, c)
			cancel()
			if errors.Is(err, counter.ErrPartialView) {
				stop(err)
				return err // ends the watch
			}
			if err != nil && ctx.Err() == nil {
				d.log.Debug("cannot read a target's row-level security", zap.String("counter", c.Name), zap.Error(err))
			}
		}
		return nil
	})
}
