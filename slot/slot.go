package slot

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/pgversion"
)

// Querier runs a query that returns one row. *pgx.Conn, *pgxpool.Pool and
// pgx.Tx all satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Both kinds of connection walcount holds can serve ReadSlot.
var (
	_ Querier = (*pgx.Conn)(nil)
	_ Querier = (*pgxpool.Pool)(nil)
)

// Values of SlotStatus.WALStatus, as PostgreSQL reports them.
const (
	WALReserved   = "reserved"
	WALExtended   = "extended"
	WALUnreserved = "unreserved"
	WALLost       = "lost"
)

// SlotStatus is one reading of a replication slot.
type SlotStatus struct {
	// Slot is the slot name.
	Slot string
	// Exists is false when no slot has that name; every field below but
	// CurrentLSN and ReadAt is then zero.
	Exists bool
	// Plugin is the output plugin ("pgoutput"), empty for a physical slot.
	Plugin string
	// SlotType is "logical" or "physical".
	SlotType string
	// Database is the database of a logical slot.
	Database string
	// Active is true while a replication connection uses the slot, and
	// ActivePID is that walsender's process ID (0 when inactive).
	Active    bool
	ActivePID int
	// WALStatus is reserved, extended, unreserved or lost (the WAL* values);
	// empty when PostgreSQL reports NULL, which it does when restart_lsn is
	// NULL.
	WALStatus string
	// SafeWALSizeBytes is how many bytes of WAL can still be written before
	// the slot risks being lost; nil when max_slot_wal_keep_size is -1
	// (unlimited) or the slot is lost.
	SafeWALSizeBytes *int64
	// LagBytes is CurrentLSN - ConfirmedFlushLSN: WAL written but not yet
	// confirmed by walcount. Zero when the slot has no confirmed position.
	LagBytes int64
	// RetainedWALBytes is CurrentLSN - RestartLSN: WAL the slot keeps on the
	// server. Zero when restart_lsn is NULL.
	RetainedWALBytes int64
	// ConfirmedFlushLSN is the position walcount last acknowledged (W);
	// RestartLSN is the oldest WAL the slot still needs; CurrentLSN is
	// pg_current_wal_lsn(). A NULL position reads as 0.
	ConfirmedFlushLSN pglogrepl.LSN
	RestartLSN        pglogrepl.LSN
	CurrentLSN        pglogrepl.LSN
	// SpillTxns, SpillBytes, StreamTxns and StreamBytes are the cumulative
	// statistics of pg_stat_replication_slots: decoded transactions that
	// did not fit in logical_decoding_work_mem and were spilled to disk or
	// streamed in progress.
	SpillTxns, SpillBytes, StreamTxns, StreamBytes int64
	// Invalidated is true when the slot can no longer be used: wal_status
	// is lost, restart_lsn is NULL, or the server gives an invalidation
	// reason.
	Invalidated bool
	// InvalidationReason is pg_replication_slots.invalidation_reason on
	// PostgreSQL 17+ (wal_removed, rows_removed, wal_level_insufficient,
	// and on 18 idle_timeout), "conflicting" when PostgreSQL 16 reports a
	// conflict, else empty.
	InvalidationReason string
	// InactiveSince is when the slot last lost its reader (PostgreSQL
	// 17+; nil while active or on older versions). On PostgreSQL 18 an
	// idle_replication_slot_timeout counts from it.
	InactiveSince *time.Time
	// Failover is true for a slot that standbys synchronise (17+), and
	// Synced for such a copy on a standby.
	Failover, Synced bool
	// ReadAt is when the reading was taken, by the local clock.
	ReadAt time.Time
}

// Err returns a *SlotLostError when the slot is invalidated, an error
// wrapping ErrSlotNotFound when it does not exist, and nil otherwise.
func (s SlotStatus) Err() error {
	switch {
	case !s.Exists:
		return fmt.Errorf("%w: no replication slot is named %q; run `walcount setup`", ErrSlotNotFound, s.Slot)
	case s.Invalidated:
		return &SlotLostError{Slot: s.Slot, WALStatus: s.WALStatus, Reason: s.InvalidationReason}
	}
	return nil
}

// slotQuery returns the statement that reads the slot, its statistics and
// the server's WAL position in one go, so that the differences are taken at
// one instant. Columns that only some versions have are named only on those
// versions (see package pgversion); elsewhere they read as NULL.
//
// LSNs are read as byte offsets from 0/0 (pg_wal_lsn_diff returns numeric; an
// LSN fits in bigint) so that the subtraction is done by the server and no
// pg_lsn decoding is needed here.
func slotQuery(v pgversion.Version) string {
	reason, inactiveSince, failover, synced := "NULL::text", "NULL::timestamptz", "false", "false"
	switch {
	case v.SlotInvalidationReason():
		reason, inactiveSince = "s.invalidation_reason", "s.inactive_since"
	case v.SlotConflicting():
		// PostgreSQL 16 says only that a slot conflicted with recovery;
		// 17 names it rows_removed or wal_level_insufficient. 16 also
		// sets conflicting for a slot invalidated by WAL removal, the one
		// invalidation that clears restart_lsn: that one is wal_removed.
		reason = "CASE WHEN s.conflicting AND s.restart_lsn IS NULL THEN 'wal_removed' WHEN s.conflicting THEN 'conflicting' END"
	}
	if v.FailoverSlots() {
		failover, synced = "coalesce(s.failover, false)", "coalesce(s.synced, false)"
	}
	return `
SELECT
	pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
	s.slot_name IS NOT NULL,
	coalesce(s.plugin, ''),
	coalesce(s.slot_type, ''),
	coalesce(s.database, ''),
	coalesce(s.active, false),
	coalesce(s.active_pid, 0),
	coalesce(s.wal_status, ''),
	s.safe_wal_size,
	pg_wal_lsn_diff(s.confirmed_flush_lsn, '0/0')::bigint,
	pg_wal_lsn_diff(s.restart_lsn, '0/0')::bigint,
	coalesce(` + reason + `, ''),
	` + inactiveSince + `,
	` + failover + `,
	` + synced + `,
	coalesce(st.spill_txns, 0),
	coalesce(st.spill_bytes, 0),
	coalesce(st.stream_txns, 0),
	coalesce(st.stream_bytes, 0)
FROM (SELECT 1) AS one
LEFT JOIN pg_replication_slots AS s ON s.slot_name = $1
LEFT JOIN pg_stat_replication_slots AS st ON st.slot_name = $1`
}

// ReadSlot reads the status of the replication slot named slot. A slot that
// does not exist is not an error: the result has Exists false (see
// SlotStatus.Err). It needs PostgreSQL 14 or later, and a primary, since
// pg_current_wal_lsn() fails during recovery.
func ReadSlot(ctx context.Context, q Querier, slot string) (SlotStatus, error) {
	v, err := pgversion.Read(ctx, q)
	if err != nil {
		return SlotStatus{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	var (
		s                          = SlotStatus{Slot: slot}
		current                    int64
		activePID                  int32
		confirmed, restart         *int64
		spillTxns, spillBytes      int64
		streamTxns, streamBytes    int64
		safeWALSize                *int64
		walStatus, invalidationWhy string
	)
	err = q.QueryRow(ctx, slotQuery(v), slot).Scan(
		&current, &s.Exists, &s.Plugin, &s.SlotType, &s.Database,
		&s.Active, &activePID, &walStatus, &safeWALSize,
		&confirmed, &restart, &invalidationWhy, &s.InactiveSince, &s.Failover, &s.Synced,
		&spillTxns, &spillBytes, &streamTxns, &streamBytes,
	)
	if err != nil {
		return SlotStatus{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	s.ReadAt = time.Now()
	s.CurrentLSN = pglogrepl.LSN(current)
	if !s.Exists {
		return s, nil
	}
	s.ActivePID = int(activePID)
	s.WALStatus = walStatus
	s.SafeWALSizeBytes = safeWALSize
	s.InvalidationReason = invalidationWhy
	s.SpillTxns, s.SpillBytes, s.StreamTxns, s.StreamBytes = spillTxns, spillBytes, streamTxns, streamBytes
	if confirmed != nil {
		s.ConfirmedFlushLSN = pglogrepl.LSN(*confirmed)
		s.LagBytes = max(current-*confirmed, 0)
	}
	if restart != nil {
		s.RestartLSN = pglogrepl.LSN(*restart)
		s.RetainedWALBytes = max(current-*restart, 0)
	}
	s.Invalidated = walStatus == WALLost || restart == nil || invalidationWhy != ""
	return s, nil
}

// ReadMaxSlotWALKeepSize returns max_slot_wal_keep_size in bytes, or -1 when
// it is unlimited (the default). A limit is what makes slot loss possible:
// with -1 a slot can never be lost, only fill the disk.
func ReadMaxSlotWALKeepSize(ctx context.Context, q Querier) (int64, error) {
	var n int64
	// current_setting renders the value with its unit ("1MB", "-1");
	// pg_size_bytes turns it into bytes and keeps -1 as -1.
	err := q.QueryRow(ctx, `SELECT pg_size_bytes(current_setting('max_slot_wal_keep_size'))`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read max_slot_wal_keep_size: %w", err)
	}
	if n < 0 {
		return -1, nil
	}
	return n, nil
}

// slotStatusJSON is SlotStatus as /status shows it: LSNs in PostgreSQL's
// "X/Y" notation, as an operator would compare them with psql output.
type slotStatusJSON struct {
	Slot               string     `json:"slot"`
	Exists             bool       `json:"exists"`
	Plugin             string     `json:"plugin,omitempty"`
	SlotType           string     `json:"slot_type,omitempty"`
	Database           string     `json:"database,omitempty"`
	Active             bool       `json:"active"`
	ActivePID          int        `json:"active_pid,omitempty"`
	WALStatus          string     `json:"wal_status,omitempty"`
	SafeWALSizeBytes   *int64     `json:"safe_wal_size_bytes"`
	LagBytes           int64      `json:"lag_bytes"`
	RetainedWALBytes   int64      `json:"retained_wal_bytes"`
	ConfirmedFlushLSN  string     `json:"confirmed_flush_lsn"`
	RestartLSN         string     `json:"restart_lsn"`
	CurrentLSN         string     `json:"current_lsn"`
	SpillTxns          int64      `json:"spill_txns"`
	SpillBytes         int64      `json:"spill_bytes"`
	StreamTxns         int64      `json:"stream_txns"`
	StreamBytes        int64      `json:"stream_bytes"`
	Invalidated        bool       `json:"invalidated"`
	InvalidationReason string     `json:"invalidation_reason,omitempty"`
	InactiveSince      *time.Time `json:"inactive_since,omitempty"`
	Failover           bool       `json:"failover"`
	Synced             bool       `json:"synced,omitempty"`
	ReadAt             time.Time  `json:"read_at"`
}

// MarshalJSON renders the status with snake_case keys and LSNs as "X/Y".
func (s SlotStatus) MarshalJSON() ([]byte, error) {
	return json.Marshal(slotStatusJSON{
		Slot: s.Slot, Exists: s.Exists, Plugin: s.Plugin, SlotType: s.SlotType, Database: s.Database,
		Active: s.Active, ActivePID: s.ActivePID, WALStatus: s.WALStatus, SafeWALSizeBytes: s.SafeWALSizeBytes,
		LagBytes: s.LagBytes, RetainedWALBytes: s.RetainedWALBytes,
		ConfirmedFlushLSN: s.ConfirmedFlushLSN.String(), RestartLSN: s.RestartLSN.String(), CurrentLSN: s.CurrentLSN.String(),
		SpillTxns: s.SpillTxns, SpillBytes: s.SpillBytes, StreamTxns: s.StreamTxns, StreamBytes: s.StreamBytes,
		Invalidated: s.Invalidated, InvalidationReason: s.InvalidationReason,
		InactiveSince: s.InactiveSince, Failover: s.Failover, Synced: s.Synced, ReadAt: s.ReadAt,
	})
}
