package preflight

import (
	"fmt"
	"time"

	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/slot"
)

// checkServer checks the version, wal_level and the free replication slots
// and WAL senders.
func (r *run) checkServer() error {
	var (
		versionText, walLevel  string
		maxSlots, maxSenders   int
		slotsUsed, sendersUsed int
	)
	err := r.conn.QueryRow(r.ctx, `
SELECT current_setting('server_version_num')::int,
       current_setting('server_version'),
       current_database(),
       current_user,
       current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       -- pg_stat_replication has one row per WAL sender, visible to every role.
       (SELECT count(*) FROM pg_stat_replication)::int`).Scan(
		&r.version, &versionText, &r.database, &r.user, &walLevel,
		&maxSlots, &maxSenders, &slotsUsed, &sendersUsed)
	if err != nil {
		return r.queryFailed(CheckServerVersion, "server settings", err)
	}

	if err := r.version.Supported(); err != nil {
		r.problem(CheckServerVersion, fmt.Sprintf("PostgreSQL %s is too old: walcount needs PostgreSQL %d or later (pgoutput delivers logical decoding messages from %d on)",
			versionText, pgversion.Oldest.Major(), pgversion.Oldest.Major()), fmt.Sprintf("upgrade PostgreSQL to %d or later", pgversion.Oldest.Major()))
	} else {
		r.ok(CheckServerVersion, "PostgreSQL "+versionText)
	}

	if walLevel == "logical" {
		r.ok(CheckWALLevel, "wal_level is logical")
	} else {
		r.problem(CheckWALLevel,
			fmt.Sprintf("wal_level is %s: logical decoding needs logical", walLevel),
			"ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL")
	}

	// The slot is looked up here because an existing slot needs neither a
	// free slot nor, while walcount streams from it, a free WAL sender.
	if err := r.lookupSlot(); err != nil {
		return err
	}
	needSlot, needSender := 1, 1
	if r.slot != nil {
		needSlot = 0
		if r.slot.Active {
			needSender = 0
		}
	}

	switch free := maxSlots - slotsUsed; {
	case free >= needSlot && needSlot == 0:
		r.ok(CheckReplicationSlots, fmt.Sprintf("max_replication_slots is %d, %d in use, slot %s among them", maxSlots, slotsUsed, r.cfg.Slot))
	case free >= needSlot:
		r.ok(CheckReplicationSlots, fmt.Sprintf("max_replication_slots is %d, %d in use: %d free", maxSlots, slotsUsed, free))
	default:
		r.problem(CheckReplicationSlots,
			fmt.Sprintf("no free replication slot: max_replication_slots is %d and %d are in use", maxSlots, slotsUsed),
			fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL (or drop an unused slot with %s)", slotsUsed+1, slot.DropFunction))
	}

	switch free := maxSenders - sendersUsed; {
	case free >= needSender && needSender == 0:
		r.ok(CheckWALSenders, fmt.Sprintf("max_wal_senders is %d, %d in use, one of them streaming slot %s", maxSenders, sendersUsed, r.cfg.Slot))
	case free >= needSender:
		r.ok(CheckWALSenders, fmt.Sprintf("max_wal_senders is %d, %d in use: %d free", maxSenders, sendersUsed, free))
	default:
		r.problem(CheckWALSenders,
			fmt.Sprintf("no free WAL sender: max_wal_senders is %d and %d are in use", maxSenders, sendersUsed),
			fmt.Sprintf("ALTER SYSTEM SET max_wal_senders = %d; then restart PostgreSQL", sendersUsed+1))
	}
	return nil
}

// checkWALKeepSize explains what max_slot_wal_keep_size means for walcount.
// Unlimited is a warning, not a problem: it is PostgreSQL's default and it
// protects the slot, at the price of the disk.
func (r *run) checkWALKeepSize() error {
	var size string
	if err := r.conn.QueryRow(r.ctx, "SELECT current_setting('max_slot_wal_keep_size')").Scan(&size); err != nil {
		return r.queryFailed(CheckSlotWALKeepSize, "max_slot_wal_keep_size", err)
	}
	if size == "-1" {
		r.warn(CheckSlotWALKeepSize,
			"max_slot_wal_keep_size is -1 (unlimited): the slot can never be lost, but while walcount is stopped or stuck "+
				"PostgreSQL keeps all WAL since the slot's position and can fill its disk; a limit trades that for "+
				"slot loss (then walcount setup --recreate-slot or on_slot_loss: recreate, and a repair of every counter). Either way, alert on the WAL the slot retains (walcount_slot_retained_wal_bytes) and on the disk: deploy/prometheus/alerts.yml does (WalcountSlotRetainedWALGrowing; the walcount-postgres group, from postgres_exporter, while no walcount runs; docs/troubleshooting.md)",
			"ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();")
		return nil
	}
	r.ok(CheckSlotWALKeepSize, fmt.Sprintf("max_slot_wal_keep_size is %s: the slot is lost if it falls further behind; watch walcount_slot_safe_wal_size_bytes", size))
	return nil
}

// checkIdleSlotTimeout warns when PostgreSQL 18's idle_replication_slot_timeout
// could invalidate walcount's slot: a slot without a reader for longer than
// the timeout is invalidated at the next checkpoint (invalidation_reason
// idle_timeout), exactly like a slot that lost its WAL. A walcount stopped
// for an upgrade or an outage longer than the timeout would then have to
// recreate its slot and reconcile.
func (r *run) checkIdleSlotTimeout() error {
	if !r.version.IdleSlotTimeout() {
		return nil
	}
	var seconds int64
	if err := r.conn.QueryRow(r.ctx, "SELECT extract(epoch FROM current_setting('idle_replication_slot_timeout')::interval)::bigint").Scan(&seconds); err != nil {
		return r.queryFailed(CheckIdleSlotTimeout, "idle_replication_slot_timeout", err)
	}
	if seconds <= 0 {
		r.ok(CheckIdleSlotTimeout, "idle_replication_slot_timeout is 0: an idle slot is never invalidated")
		return nil
	}
	timeout := time.Duration(seconds) * time.Second
	msg := fmt.Sprintf("idle_replication_slot_timeout is %s: if walcount is stopped (or cannot connect) for longer, PostgreSQL invalidates slot %s at the next checkpoint (idle_timeout), and the counters need walcount setup --recreate-slot (or on_slot_loss: recreate) and a repair of every counter",
		timeout, r.cfg.Slot)
	if r.slot != nil && !r.slot.Active && r.slot.InactiveSince != nil {
		left := time.Until(r.slot.InactiveSince.Add(timeout)).Round(time.Second)
		if left > 0 {
			msg += fmt.Sprintf("; the slot has had no reader since %s: start walcount within %s", r.slot.InactiveSince.UTC().Format(time.RFC3339), left)
		} else {
			msg += fmt.Sprintf("; the slot has had no reader since %s, past the timeout: the next checkpoint invalidates it", r.slot.InactiveSince.UTC().Format(time.RFC3339))
		}
	}
	r.warn(CheckIdleSlotTimeout, msg,
		"ALTER SYSTEM SET idle_replication_slot_timeout = 0; SELECT pg_reload_conf(); (or keep it above walcount's longest planned downtime and alert on walcount_slot_active == 0)")
	return nil
}
