package preflight

import (
	"fmt"
)

// minVersion is the oldest PostgreSQL walcount supports: pgoutput's
// "messages" option, which delivers walcount's heartbeat and reconcile
// markers (DESIGN §2 rule 8, §5), arrived in PostgreSQL 14.
const minVersion = 140000

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

	if r.version < minVersion {
		r.problem(CheckServerVersion, fmt.Sprintf("PostgreSQL %s is too old: walcount needs 14 or later (pgoutput messages)", versionText), "upgrade PostgreSQL")
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
		if r.slot.active {
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
			fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL (or drop an unused slot with pg_drop_replication_slot)", slotsUsed+1))
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
				"slot loss (then walcount setup --recreate-slot and walcount reconcile). Either way, alert on walcount_slot_retained_wal_bytes",
			"ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();")
		return nil
	}
	r.ok(CheckSlotWALKeepSize, fmt.Sprintf("max_slot_wal_keep_size is %s: the slot is lost if it falls further behind; watch walcount_slot_safe_wal_size_bytes", size))
	return nil
}
