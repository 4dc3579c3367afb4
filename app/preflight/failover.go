package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/slot"
)

// CheckFailover names the failover-readiness findings.
const CheckFailover = "failover"

// checkFailover reports what the primary's physical standbys need for
// walcount's slot to survive a failover (design rule 16). From PostgreSQL
// 17 on, a failover slot is synchronised to standbys that run the slot sync
// worker, and the primary holds logical changes back until the standbys in
// synchronized_standby_slots have them; before 17 the slot is simply gone
// on a promoted standby. What can only be seen on a standby is stated as a
// requirement, with the settings to set.
func (r *run) checkFailover() error {
	var inRecovery bool
	if err := r.conn.QueryRow(r.ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return r.queryFailed(CheckFailover, "whether the server is a standby", err)
	}
	if inRecovery {
		r.problem(CheckFailover, "the server is a standby (in recovery): walcount needs the primary, where its slot and counters are written",
			"point --database-url at the primary, or list every host with target_session_attrs=read-write")
		return nil
	}
	if r.onStandby {
		// The slot lives on a hot standby (checkStandby): it cannot be a
		// failover slot, and the primary's failover is the standby's
		// business (it follows the new primary with its slot).
		return nil
	}
	standbys, err := slot.Standbys(r.ctx, r.conn)
	if err != nil {
		return r.queryFailed(CheckFailover, "the physical standbys", err)
	}
	physical, err := slot.PhysicalSlots(r.ctx, r.conn)
	if err != nil {
		return r.queryFailed(CheckFailover, "the physical slots", err)
	}
	if len(standbys) == 0 && len(physical) == 0 {
		r.ok(CheckFailover, "no physical standby or physical slot: nothing to prepare for a failover")
		return nil
	}

	if !r.version.FailoverSlots() {
		msg := fmt.Sprintf("PostgreSQL %s cannot carry logical slots to standbys: after a failover walcount's slot is gone on the new primary", r.version)
		if r.cfg.OnSlotLoss == config.SlotLossRecreate {
			r.ok(CheckFailover, msg+"; on_slot_loss is recreate, so walcount recreates it and reconciles every counter by itself")
		} else {
			r.warn(CheckFailover, msg+", and walcount stops until an operator recreates it",
				"set on_slot_loss: recreate, so that walcount recreates the slot and reconciles every counter by itself")
		}
		return nil
	}

	if r.slot != nil && !r.slot.Failover {
		r.warn(CheckFailover,
			fmt.Sprintf("replication slot %s is not a failover slot: standbys do not keep a copy, so it is gone after a failover", r.cfg.Slot),
			fmt.Sprintf(`psql "%s replication=database" -c 'ALTER_REPLICATION_SLOT %s (FAILOVER)' (with walcount stopped), or walcount setup --recreate-slot`,
				"dbname="+r.database, r.ident(r.cfg.Slot)))
	}

	listed, setting, err := slot.StandbySlots(r.ctx, r.conn)
	if err != nil {
		return r.queryFailed(CheckFailover, "synchronized_standby_slots", err)
	}
	var missing []string
	for _, s := range standbys {
		if s.Slot == "" {
			r.warn(CheckFailover,
				fmt.Sprintf("standby %s streams without a replication slot: it cannot synchronise walcount's slot, so a failover to it loses the slot", s.Name),
				fmt.Sprintf("SELECT pg_create_physical_replication_slot('%s_slot'); then on the standby primary_slot_name = '%s_slot'", s.Name, s.Name))
			continue
		}
		if !slices.Contains(listed, s.Slot) {
			missing = append(missing, s.Slot)
		}
	}
	if len(missing) > 0 {
		want := append(slices.Clone(listed), missing...)
		r.warn(CheckFailover,
			fmt.Sprintf("synchronized_standby_slots (%q) does not name the physical slot(s) %s: walcount's slot may be confirmed past what such a standby has, and after a failover to it changes would be skipped",
				setting, strings.Join(missing, ", ")),
			fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = '%s'; SELECT pg_reload_conf();", strings.Join(want, ",")))
	} else {
		r.ok(CheckFailover, fmt.Sprintf("synchronized_standby_slots names every standby's physical slot (%s): walcount confirms its slot only once each of them has the flush", setting))
	}
	for _, s := range standbys {
		if s.Slot == "" {
			continue
		}
		r.ok(CheckFailover, fmt.Sprintf("on standby %s (its physical slot %s), walcount's slot survives a failover only with: sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name = '%s', and dbname=%s in primary_conninfo",
			s.Name, s.Slot, s.Slot, r.database))
	}
	return nil
}
