package slot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/pgversion"
)

// The statements on walcount's replication slot live here, and only here:
// setup, teardown, the daemon's recreation of a lost slot, the demo and
// status all create, drop and read the slot through this file.

// Conn runs the slot's statements: a connection, a pool or a transaction.
type Conn interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DropFunction is PostgreSQL's function that drops a slot, for fixes that
// name it.
const DropFunction = "pg_drop_replication_slot"

// DropSQL drops the slot $1; setup --print-sql and teardown print it.
const DropSQL = "SELECT " + DropFunction + "($1)"

// DropIfExistsSQL drops the slot $1 when it exists.
const DropIfExistsSQL = `SELECT ` + DropFunction + `(slot_name) FROM pg_replication_slots WHERE slot_name = $1`

// CreateSQL creates walcount's slot ($1) and returns its consistent point
// as text (scan it into a state.LSN). From PostgreSQL 17 on the slot is a
// failover slot: standbys that synchronise slots keep a copy, so that it
// survives a failover (design rule 16).
func CreateSQL(v pgversion.Version) string {
	if v.FailoverSlots() {
		return "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
	}
	return "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
}

// Drop drops the slot name; an error when it does not exist or is in use.
func Drop(ctx context.Context, q Conn, name string) error {
	_, err := q.Exec(ctx, DropSQL, name)
	return err
}

// DropIfExists drops the slot name when it exists and says whether it
// did; a slot in use is an error.
func DropIfExists(ctx context.Context, q Conn, name string) (bool, error) {
	tag, err := q.Exec(ctx, DropIfExistsSQL, name)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// DropInactive drops the slot name when it exists and nobody streams from
// it (what is left of a lost slot).
func DropInactive(ctx context.Context, q Conn, name string) error {
	_, err := q.Exec(ctx, DropIfExistsSQL+` AND NOT active`, name)
	return err
}

// Exists reports whether the slot name exists.
func Exists(ctx context.Context, q Querier, name string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", name).Scan(&ok)
	return ok, err
}

// Plugin returns the output plugin of the slot name, and false when the
// slot does not exist.
func Plugin(ctx context.Context, q Querier, name string) (plugin string, exists bool, err error) {
	err = q.QueryRow(ctx, "SELECT true, coalesce(plugin, '') FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&exists, &plugin)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return plugin, exists, err
}

// ConfirmedFlush scans the slot's confirmed_flush_lsn, as text, into dst
// (a *state.LSN).
func ConfirmedFlush(ctx context.Context, q Querier, name string, dst any) error {
	if err := q.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", name).Scan(dst); err != nil {
		return fmt.Errorf("read replication slot %q: %w", name, err)
	}
	return nil
}

// ActivePID returns the pid of the walsender that streams from the slot
// name, nil when none does.
func ActivePID(ctx context.Context, q Querier, name string) (*int64, error) {
	var pid *int64
	err := q.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&pid)
	return pid, err
}

// StartError explains a failed START_REPLICATION on the slot name: when the
// slot turns out lost (invalidated), a *SlotLostError that says what to do,
// with cause; otherwise cause itself (a missing slot keeps ErrMissing).
func StartError(ctx context.Context, q Querier, name string, cause error) error {
	st, err := ReadSlot(ctx, q, name)
	if err != nil {
		return cause
	}
	var lost *SlotLostError
	if errors.As(st.Err(), &lost) {
		return fmt.Errorf("%w (start replication: %v)", lost, cause)
	}
	return cause
}

// Info is the slot's row of pg_replication_slots as walcount check reads
// it.
type Info struct {
	Plugin, Type  string
	Database      *string
	Active        bool
	RestartLSN    *string
	ConfirmedLSN  *string
	WALStatus     *string
	InactiveSince *time.Time // PostgreSQL 17+
	Failover      bool       // PostgreSQL 17+
}

// ReadInfo reads the slot name's row on a server of version v; nil, nil
// when the slot does not exist.
func ReadInfo(ctx context.Context, q Querier, v pgversion.Version, name string) (*Info, error) {
	var s Info
	inactiveSince, failover := "NULL::timestamptz", "false"
	if v.SlotInvalidationReason() {
		inactiveSince = "inactive_since"
	}
	if v.FailoverSlots() {
		failover = "failover"
	}
	err := q.QueryRow(ctx, `
SELECT coalesce(plugin, ''), slot_type, database, active,
       restart_lsn::text, confirmed_flush_lsn::text, wal_status, `+inactiveSince+`, `+failover+`
FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(
		&s.Plugin, &s.Type, &s.Database, &s.Active, &s.RestartLSN, &s.ConfirmedLSN, &s.WALStatus, &s.InactiveSince, &s.Failover)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// InitCheckpointSQL is the statement that starts walcount's checkpoint
// (state's walcount.checkpoint) at the consistent point of the new slot
// $1; setup runs it after the slot's creation and --print-sql shows it.
const InitCheckpointSQL = `INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at)
SELECT $1, confirmed_flush_lsn, now() FROM pg_replication_slots WHERE slot_name = $1
ON CONFLICT (slot_name) DO UPDATE SET lsn = excluded.lsn, updated_at = now()`
