package daemon

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/state"
)

// slotWaitPoll is how often a slot creation in progress looks at what it
// waits for.
const slotWaitPoll = time.Second

// SlotCreationWait is what the creation of the replication slot waits for.
// PostgreSQL creates a logical slot once every transaction that holds an xid
// when the creation starts has ended; a long app transaction holds it up,
// and nothing is counted meanwhile. It is in /status while it lasts.
type SlotCreationWait struct {
	// Since is when the creation started; WaitingSeconds the time since.
	Since          time.Time `json:"since"`
	WaitingSeconds float64   `json:"waiting_seconds"`
	// PID, XactAgeSeconds, ApplicationName and State describe the oldest
	// running transaction that holds an xid (pg_stat_activity): the one
	// the creation waits for longest. PID is 0 when none is seen (the
	// role may not see other roles' sessions without pg_read_all_stats).
	PID             int32   `json:"pid"`
	XactAgeSeconds  float64 `json:"xact_age_seconds"`
	ApplicationName string  `json:"application_name,omitempty"`
	State           string  `json:"state,omitempty"`
}

func (w SlotCreationWait) String() string {
	if w.PID == 0 {
		return fmt.Sprintf("creating the replication slot: waiting %s for running transactions to end", time.Since(w.Since).Round(time.Second))
	}
	return fmt.Sprintf("creating the replication slot: waiting %s for the transaction of pid %d (open %s, %s) to end",
		time.Since(w.Since).Round(time.Second), w.PID, (time.Duration(w.XactAgeSeconds * float64(time.Second))).Round(time.Second), w.State)
}

// watchSlotCreation follows a slot creation made on the connection of
// backend pid creator: every slotWaitPoll while it lasts it reads the
// oldest running transaction that holds an xid, publishes it for /status
// and /readyz, and logs it once, the first time it is seen. The returned
// function ends the watch and withdraws what it published.
func (d *Daemon) watchSlotCreation(ctx context.Context, creator uint32) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	since := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(slotWaitPoll)
		defer t.Stop()
		logged := int32(-1)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w := SlotCreationWait{Since: since}
			rctx, rcancel := context.WithTimeout(ctx, sampleTimeout)
			x, _, err := state.OldestXact(rctx, d.pool, creator)
			rcancel()
			if err != nil && ctx.Err() != nil {
				return
			}
			w.PID, w.XactAgeSeconds, w.ApplicationName, w.State = x.PID, x.Age.Seconds(), x.ApplicationName, x.State
			d.mu.Lock()
			d.state.slotWait = &w
			d.mu.Unlock()
			if w.PID != logged {
				logged = w.PID
				d.log.Warn("creating the replication slot waits for the oldest running transaction to end",
					zap.Int32("pid", w.PID), zap.Duration("xact_age", time.Duration(w.XactAgeSeconds*float64(time.Second))),
					zap.String("application_name", w.ApplicationName), zap.String("state", w.State),
					zap.Duration("waiting", time.Since(since)))
			}
		}
	}()
	return func() {
		cancel()
		<-done
		d.mu.Lock()
		d.state.slotWait = nil
		d.mu.Unlock()
	}
}
