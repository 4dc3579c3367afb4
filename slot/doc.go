// Package slot owns walcount's logical replication slot: every statement
// that creates, drops or reads it (sql.go; its creation on a hot standby,
// standby.go), the physical standbys that must carry it through a
// failover (standbys.go: synchronized_standby_slots, their slots'
// positions, a standby's received WAL), the slot's errors, and the
// monitor that watches its health.
//
// A logical slot makes the server keep every WAL segment from the slot's
// restart_lsn on, so that nothing walcount has not yet confirmed can be
// removed. That guarantee is what makes walcount exact (docs/design.md §2), and it
// has two failure modes the monitor makes visible:
//
//   - Lag. WAL piles up on the server while walcount is slow or stopped:
//     LagBytes (pg_current_wal_lsn() - confirmed_flush_lsn) and
//     RetainedWALBytes (pg_current_wal_lsn() - restart_lsn) grow, and the
//     server's disk fills.
//   - Loss. With max_slot_wal_keep_size set, a checkpoint may remove WAL the
//     slot still needs. wal_status goes from "reserved" or "extended" to
//     "unreserved" (the next checkpoint will remove it) and then to "lost",
//     and the slot is invalidated for good: the changes in the removed WAL
//     will never be decoded, so the counters can no longer be kept exact from
//     the stream. Design rule 12: Monitor.Run returns a *SlotLostError,
//     which stops walcount run with the fix, unless on_slot_loss is
//     recreate (Options.KeepWatchingLostSlot): then the daemon recreates
//     the slot and repairs every counter, and the monitor watches the new
//     slot.
//
// ReadSlot reads one snapshot from pg_replication_slots
// (https://www.postgresql.org/docs/current/view-pg-replication-slots.html)
// and pg_stat_replication_slots
// (https://www.postgresql.org/docs/current/monitoring-stats.html#MONITORING-PG-STAT-REPLICATION-SLOTS-VIEW,
// PostgreSQL 14 and later); Monitor polls it, exports it as metrics and keeps
// the latest for /status and /readyz. max_slot_wal_keep_size is described in
// https://www.postgresql.org/docs/current/runtime-config-replication.html#GUC-MAX-SLOT-WAL-KEEP-SIZE.
//
// The monitor only reads. It runs on its own connection pool, never on the
// replication connection, which belongs to the cdc package.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package slot
