// Package pgversion is the one place that knows what differs between the
// PostgreSQL major versions walcount supports (14 to 18): function
// signatures, catalog columns and replication features. Every caller asks a
// Version, read once from server_version_num, instead of trying a statement
// and falling back when it fails.
//
// The differences walcount relies on:
//
//   - pg_logical_emit_message gained a fourth argument, flush boolean
//     DEFAULT false, in PostgreSQL 17: a call with three arguments still
//     resolves, but a signature written as (boolean, text, text), as
//     has_function_privilege and GRANT need it, does not.
//   - pg_replication_slots gained two_phase (15), conflicting (16),
//     inactive_since, invalidation_reason, failover and synced (17);
//     wal_status and safe_wal_size exist since 13.
//   - PostgreSQL 17 added failover slots (pg_create_logical_replication_slot's
//     fifth argument, synchronized_standby_slots, sync_replication_slots).
//   - PostgreSQL 18 added idle_replication_slot_timeout, which invalidates a
//     slot that had no reader for that long (invalidation_reason
//     idle_timeout).
//   - Publications have column lists and row filters from PostgreSQL 15 on.
//   - pgoutput delivers logical decoding messages (the "messages" option)
//     from PostgreSQL 14 on, which is why 14 is the oldest supported version.
//
// See https://www.postgresql.org/docs/current/view-pg-replication-slots.html
// and https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-REPLICATION.
package pgversion

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Version is a server_version_num: 170010 for 17.10, 140023 for 14.23.
type Version int

// Oldest is the oldest PostgreSQL walcount supports.
const Oldest Version = 140000

// Major versions named by the features that arrived in them.
const (
	v15 Version = 150000
	v16 Version = 160000
	v17 Version = 170000
	v18 Version = 180000
)

// ErrUnsupported is wrapped by Supported's error.
var ErrUnsupported = errors.New("unsupported PostgreSQL version")

// Querier reads one row; *pgx.Conn, *pgxpool.Pool and pgx.Tx fit.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Read returns the server's version.
func Read(ctx context.Context, q Querier) (Version, error) {
	var v int
	if err := q.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	return Version(v), nil
}

// Major returns the major version: 17 for 170010.
func (v Version) Major() int { return int(v) / 10000 }

// String renders the version as PostgreSQL 10 and later number it: "17.10".
func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major(), int(v)%10000) }

// Supported returns nil for PostgreSQL 14 and later, and otherwise an error
// wrapping ErrUnsupported that names the version found and the oldest one
// supported.
func (v Version) Supported() error {
	if v >= Oldest {
		return nil
	}
	return fmt.Errorf("%w: the server is PostgreSQL %s; walcount needs PostgreSQL %d or later (pgoutput delivers the logical decoding messages walcount relies on from %d on)",
		ErrUnsupported, v, Oldest.Major(), Oldest.Major())
}

// EmitMessageSignature is pg_logical_emit_message's text variant as
// has_function_privilege and GRANT EXECUTE ON FUNCTION must spell it.
func (v Version) EmitMessageSignature() string {
	if v >= v17 {
		return "pg_logical_emit_message(boolean, text, text, boolean)"
	}
	return "pg_logical_emit_message(boolean, text, text)"
}

// PublicationColumnLists reports whether publications can have column
// lists and row filters, and pg_publication_tables shows them (15+).
func (v Version) PublicationColumnLists() bool { return v >= v15 }

// SlotConflicting reports whether pg_replication_slots has conflicting
// (16+).
func (v Version) SlotConflicting() bool { return v >= v16 }

// SlotInvalidationReason reports whether pg_replication_slots has
// invalidation_reason and inactive_since (17+).
func (v Version) SlotInvalidationReason() bool { return v >= v17 }

// FailoverSlots reports whether logical slots can be synchronised to
// physical standbys: pg_replication_slots.failover and synced,
// synchronized_standby_slots, sync_replication_slots (17+).
func (v Version) FailoverSlots() bool { return v >= v17 }

// IdleSlotTimeout reports whether idle_replication_slot_timeout exists
// (18+).
func (v Version) IdleSlotTimeout() bool { return v >= v18 }

// PublishGeneratedColumns reports whether a publication can publish
// STORED generated columns (publish_generated_columns, 18+). From 18 on,
// PostgreSQL refuses UPDATE and DELETE of a published table whose replica
// identity holds a generated column the publication does not publish;
// a VIRTUAL generated column (18+) can never be published.
func (v Version) PublishGeneratedColumns() bool { return v >= v18 }

// StandbyDecoding reports whether a hot standby can hold a logical slot
// and decode (16+).
func (v Version) StandbyDecoding() bool { return v >= v16 }
