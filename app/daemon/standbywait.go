package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/slot"
)

// waitForStandby is the wait event of a PostgreSQL 17+ walsender that
// holds a logical slot's changes back until the physical slots named in
// synchronized_standby_slots have confirmed the WAL they come from.
const waitForStandby = "WaitForStandbyConfirmation"

// standbyWaitMisses is how many samples in a row must find the walsender
// out of its wait before the wait counts as over.
const standbyWaitMisses = 2

// StandbyWait is the walsender's wait for the standbys: from PostgreSQL 17
// on, a logical walsender sends nothing past what every physical slot named
// in synchronized_standby_slots has confirmed, so a standby that is down
// freezes every counter while W's bytes held (ack_held_bytes) stay small.
type StandbyWait struct {
	// Since is when the wait was first seen; Seconds the time since.
	Since   time.Time `json:"since"`
	Seconds float64   `json:"seconds"`
	// Slots are the named physical slots that have not confirmed the
	// server's flushed WAL: the standbys waited for.
	Slots []StandbySlotWait `json:"slots"`
}

// StandbySlotWait is one physical slot waited for.
type StandbySlotWait = slot.StandbySlot

func (w StandbyWait) String() string {
	var ss []string
	for _, s := range w.Slots {
		switch {
		case !s.Exists:
			ss = append(ss, s.Slot+" (no such slot)")
		case !s.Active:
			ss = append(ss, fmt.Sprintf("%s (no standby connected, %d bytes behind)", s.Slot, s.BehindBytes))
		default:
			ss = append(ss, fmt.Sprintf("%s (%d bytes behind)", s.Slot, s.BehindBytes))
		}
	}
	return fmt.Sprintf("the walsender has been holding walcount's changes back for %s until standby slot %s confirms them",
		time.Since(w.Since).Round(time.Second), strings.Join(ss, ", "))
}

// checkStandbyWait reads the wait event of the session's walsender and,
// while it waits for the standbys, which named slots lag; it publishes the
// wait for /status, exports walcount_standby_wait_seconds and logs the
// start and the end of each wait.
func (d *Daemon) checkStandbyWait(ctx context.Context) {
	d.mu.Lock()
	stream, prev := d.state.stream, d.state.standbyWait
	d.mu.Unlock()
	var cur *StandbyWait
	if stream != nil {
		rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
		defer cancel()
		var waiting bool
		err := d.slotDB.QueryRow(rctx, `SELECT coalesce((SELECT wait_event = $2 FROM pg_stat_activity WHERE pid = $1), false)`,
			int64(stream.BackendPID()), waitForStandby).Scan(&waiting)
		if err != nil {
			return // unknown: keep what was known
		}
		switch {
		case waiting:
			d.standbyMisses = 0
			cur = &StandbyWait{Since: time.Now()}
			if prev != nil {
				cur.Since = prev.Since
			}
			cur.Slots = d.standbySlotsBehind(rctx)
		case prev != nil && d.standbyMisses < standbyWaitMisses:
			// A waiting walsender wakes now and then (to answer a
			// keepalive, to read more WAL): one sample out of the wait
			// does not end it.
			d.standbyMisses++
			cur = prev
		}
	}
	d.mu.Lock()
	d.state.standbyWait = cur
	d.mu.Unlock()
	switch {
	case cur != nil:
		d.m.StandbyWaitSeconds.Set(max(time.Since(cur.Since), 0).Seconds())
		if prev == nil {
			d.log.Warn("the walsender holds walcount's changes back until the standbys in synchronized_standby_slots confirm them; nothing is counted meanwhile",
				zap.String("standby_wait", cur.String()))
		}
	default:
		d.m.StandbyWaitSeconds.Set(0)
		if prev != nil {
			d.log.Info("the standbys confirmed; the walsender sends walcount's changes again", zap.Duration("waited", time.Since(prev.Since)))
		}
	}
}

// standbySlotsBehind returns the slots named in synchronized_standby_slots
// that have not confirmed the server's flushed WAL (all of them when none
// is behind: the wait is then for WAL about to be flushed).
func (d *Daemon) standbySlotsBehind(ctx context.Context) []StandbySlotWait {
	names, _, err := slot.StandbySlots(ctx, d.pool)
	if err != nil || len(names) == 0 {
		return nil
	}
	all, err := slot.ReadStandbySlots(ctx, d.pool, names)
	if err != nil {
		return nil
	}
	var behind []StandbySlotWait
	for _, s := range all {
		if !s.Exists || !s.Active || s.BehindBytes != 0 {
			behind = append(behind, s)
		}
	}
	if len(behind) == 0 {
		return all
	}
	return behind
}
