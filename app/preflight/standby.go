package preflight

import (
	"fmt"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/redact"
)

// CheckStandbyDecoding is the check of a replication_url that names a hot
// standby: decoding on a standby (PostgreSQL 16 and later).
const CheckStandbyDecoding = "standby_decoding"

// connectSlotServer opens the SQL connection to replication_url's server
// when it is another one than database_url's (r.slotConn; r.conn
// otherwise), and reads whether it is a standby (r.onStandby).
func (r *run) connectSlotServer() error {
	r.slotConn = r.conn
	if !r.cfg.SeparateSlotServer() {
		return nil
	}
	c, err := r.cfg.ConnectSlotSQL(r.ctx)
	if err != nil {
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		r.problem(CheckReplicationConn, fmt.Sprintf("cannot open an SQL connection to replication_url %s: %s", redact.URL(r.cfg.ReplicationURL), redact.URL(err.Error())),
			"point replication_url at a PostgreSQL server (the primary, or a hot standby of PostgreSQL 16 or later) that walcount's role may log in to")
		return nil
	}
	r.slotConn = c
	r.closeSlotConn = func() { _ = c.Close(r.ctx) }
	if err := c.QueryRow(r.ctx, "SELECT pg_is_in_recovery()").Scan(&r.onStandby); err != nil {
		return r.queryFailed(CheckStandbyDecoding, "whether replication_url is a standby", err)
	}
	return nil
}

// checkStandby checks what decoding on a hot standby needs: PostgreSQL 16
// or later, hot_standby_feedback (without it VACUUM on the primary removes
// catalog rows the slot still needs, and the standby invalidates the slot:
// a conflict with recovery), and a physical slot for the standby on the
// primary (primary_slot_name), which keeps the feedback while the standby
// is disconnected.
func (r *run) checkStandby() error {
	if !r.onStandby {
		return nil
	}
	var version int
	var feedback, primarySlot string
	err := r.slotConn.QueryRow(r.ctx, `SELECT current_setting('server_version_num')::int, current_setting('hot_standby_feedback'), current_setting('primary_slot_name')`).Scan(
		&version, &feedback, &primarySlot)
	if err != nil {
		return r.queryFailed(CheckStandbyDecoding, "the standby's settings", err)
	}
	if version < 160000 {
		r.configProblem(CheckStandbyDecoding, fmt.Sprintf("replication_url %s names a standby of PostgreSQL %d: decoding on a standby needs PostgreSQL 16 or later", redact.URL(r.cfg.ReplicationURL), version/10000),
			"point replication_url at the primary, or upgrade to PostgreSQL 16 or later")
		return nil
	}
	if feedback != "on" {
		r.problem(CheckStandbyDecoding, "hot_standby_feedback is off on the standby that holds the slot: VACUUM on the primary may remove catalog rows the slot still needs, and the standby then invalidates the slot (a conflict with recovery: rows_removed), losing every change since",
			"on the standby: ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();")
	} else {
		r.ok(CheckStandbyDecoding, "hot_standby_feedback is on on the standby that holds the slot")
	}
	if primarySlot == "" {
		r.warn(CheckStandbyDecoding, "the standby that holds the slot streams without a physical slot on the primary (primary_slot_name is empty): while it is disconnected its hot_standby_feedback is lost, and VACUUM on the primary may remove catalog rows the slot needs",
			"on the primary: SELECT pg_create_physical_replication_slot('<standby>'); on the standby: ALTER SYSTEM SET primary_slot_name = '<standby>'; SELECT pg_reload_conf();")
	}
	msg := "replication_url names a hot standby: the slot decodes there; heartbeats, flushes, markers and reconciliation go to the primary (database_url), and a W is confirmed once the standby has received its flush"
	if r.cfg.OnSlotLoss != config.SlotLossRecreate {
		msg += "; if the primary fails over to another server, the standby follows it and keeps the slot; if this standby is lost, on_slot_loss: recreate makes the slot anew and repairs every counter"
	}
	r.ok(CheckStandbyDecoding, msg)
	return nil
}
