package slot

import (
	"context"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// The statements on the physical standbys that must carry walcount's slot
// through a failover (design rule 16) live here: the flusher's standby
// gate, the daemon's view of the walsender's wait and walcount check all
// read them through this file. The errors are the server's: the caller
// says what it was reading.

// RowsQuerier runs a query that returns rows. *pgx.Conn, *pgxpool.Pool and
// pgx.Tx all satisfy it.
type RowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// StandbySlots reads synchronized_standby_slots: the physical slots whose
// standbys must have flushed WAL before a logical walsender sends changes
// from it, and before which walcount confirms no W. setting is the value
// as the server holds it, names the slots it lists. The setting exists
// from PostgreSQL 17 on; before, both are empty, and no standby can carry
// a logical slot anyway.
func StandbySlots(ctx context.Context, q Querier) (names []string, setting string, err error) {
	if err := q.QueryRow(ctx, `SELECT coalesce(current_setting('synchronized_standby_slots', true), '')`).Scan(&setting); err != nil {
		return nil, "", err
	}
	for _, s := range strings.Split(setting, ",") {
		if s = strings.Trim(strings.TrimSpace(s), `"`); s != "" {
			names = append(names, s)
		}
	}
	return names, setting, nil
}

// StandbysFlushed returns the least restart_lsn of the physical slots
// names (WAL their standbys have flushed), or nil unless each of them
// exists.
func StandbysFlushed(ctx context.Context, q Querier, names []string) (*pglogrepl.LSN, error) {
	var flushed *pglogrepl.LSN
	err := q.QueryRow(ctx, `SELECT CASE WHEN count(*) = cardinality($1::text[]) THEN min(restart_lsn)::text END
FROM pg_replication_slots WHERE slot_name = ANY ($1) AND slot_type = 'physical'`, names).Scan(&flushed)
	return flushed, err
}

// StandbySlot is a physical slot named in synchronized_standby_slots, as
// /status shows it.
type StandbySlot struct {
	Slot string `json:"slot"`
	// Exists is false for a named slot that does not exist; Active says
	// whether a standby is connected to it.
	Exists bool `json:"exists"`
	Active bool `json:"active"`
	// BehindBytes is how far its confirmed position trails the server's
	// flushed WAL; -1 when it has none.
	BehindBytes int64 `json:"behind_bytes"`
}

// ReadStandbySlots reads the physical slots names, in name order, one
// StandbySlot a name, whether or not the slot exists.
func ReadStandbySlots(ctx context.Context, q RowsQuerier, names []string) ([]StandbySlot, error) {
	rows, err := q.Query(ctx, `
SELECT n.slot_name, s.slot_name IS NOT NULL, coalesce(s.active, false),
       coalesce(pg_wal_lsn_diff(pg_current_wal_flush_lsn(), s.restart_lsn), -1)::bigint
FROM unnest($1::text[]) AS n(slot_name)
LEFT JOIN pg_replication_slots s ON s.slot_name = n.slot_name AND s.slot_type = 'physical'
ORDER BY 1`, names)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StandbySlot, error) {
		var s StandbySlot
		err := row.Scan(&s.Slot, &s.Exists, &s.Active, &s.BehindBytes)
		return s, err
	})
}

// PhysicalSlots returns the names of the server's physical slots, in
// order.
func PhysicalSlots(ctx context.Context, q Querier) ([]string, error) {
	var names []string
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(slot_name::text ORDER BY slot_name), '{}') FROM pg_replication_slots WHERE slot_type = 'physical'`).Scan(&names)
	return names, err
}

// Standby is a physical standby streaming from the server, and the
// physical slot it streams from ("" when none).
type Standby struct {
	Name, Slot string
}

// Standbys returns the physical standbys streaming from the server, by
// name (application_name, else the client's address, else the
// walsender's pid). Physical walsenders are the ones not connected to a
// database; a logical one (walcount's own, another consumer's, a
// replication connection that only identified the system) is.
func Standbys(ctx context.Context, q RowsQuerier) ([]Standby, error) {
	rows, err := q.Query(ctx, `
SELECT coalesce(nullif(r.application_name, ''), host(r.client_addr), 'pid ' || r.pid), coalesce(s.slot_name::text, '')
FROM pg_stat_replication r
JOIN pg_stat_activity a ON a.pid = r.pid
LEFT JOIN pg_replication_slots s ON s.active_pid = r.pid
WHERE a.datid IS NULL AND r.state <> 'backup' AND coalesce(s.slot_type, 'physical') = 'physical'
ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Standby, error) {
		var s Standby
		err := row.Scan(&s.Name, &s.Slot)
		return s, err
	})
}

// Received reads, on a hot standby, whether it is still one (in
// recovery) and how far it has received and flushed its primary's WAL
// (nil before it received any).
func Received(ctx context.Context, q Querier) (inRecovery bool, received *pglogrepl.LSN, err error) {
	err = q.QueryRow(ctx, `SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn()::text`).Scan(&inRecovery, &received)
	return inRecovery, received, err
}
