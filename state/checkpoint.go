package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/operator"
)

// LSN is a PostgreSQL WAL position.
type LSN = pglogrepl.LSN

// ErrNoCheckpoint means walcount setup has not run for the slot.
var ErrNoCheckpoint = operator.NewError("no checkpoint for the slot (run walcount setup)")

// ReadCheckpoint returns W, the checkpoint of slot.
func ReadCheckpoint(ctx context.Context, q Querier, slot string) (LSN, error) {
	var lsn LSN
	err := q.QueryRow(ctx, `SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1`, slot).Scan(&lsn)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read checkpoint of slot %q: %w", slot, ErrNoCheckpoint)
	}
	if err != nil {
		return 0, fmt.Errorf("read checkpoint of slot %q: %w", slot, err)
	}
	return lsn, nil
}

// ReadCheckpointAge returns W and how long ago it last moved, measured by
// the server's clock so that clock skew between hosts does not distort it.
// A plain read is not blocked by a flush in progress, which holds the
// row's lock: it sees the last committed W.
func ReadCheckpointAge(ctx context.Context, q Querier, slot string) (LSN, time.Duration, error) {
	var (
		lsn LSN
		age float64
	)
	err := q.QueryRow(ctx, `SELECT lsn::text, extract(epoch FROM clock_timestamp() - updated_at)::float8
FROM walcount.checkpoint WHERE slot_name = $1`, slot).Scan(&lsn, &age)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, fmt.Errorf("read checkpoint of slot %q: %w", slot, ErrNoCheckpoint)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read checkpoint of slot %q: %w", slot, err)
	}
	return lsn, time.Duration(max(age, 0) * float64(time.Second)), nil
}

// CompareAndSet moves the checkpoint of slot from W to next inside tx, the
// transaction that applies the deltas of (W, next] (design rules 1 and 2).
// It reports false when the checkpoint is not W: someone committed the
// batch already, and the caller must roll back. Run it first in the
// transaction, so that it takes the checkpoint row's lock before any
// counter row: a concurrent flusher waits on it, then matches no row.
func CompareAndSet(ctx context.Context, tx pgx.Tx, slot string, w, next LSN) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE walcount.checkpoint SET lsn = $2::text::pg_lsn, updated_at = now()
WHERE slot_name = $1 AND lsn = $3::text::pg_lsn`, slot, next.String(), w.String())
	if err != nil {
		return false, fmt.Errorf("move checkpoint: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// InitCheckpoint writes the checkpoint of slot at lsn. With replace it
// overwrites an existing one (a new slot starts a new history); without, an
// existing checkpoint is kept. It returns the checkpoint as it now is.
func InitCheckpoint(ctx context.Context, q Querier, slot string, lsn LSN, replace bool) (LSN, error) {
	conflict := "DO NOTHING"
	if replace {
		conflict = "DO UPDATE SET lsn = excluded.lsn, updated_at = now()"
	}
	if _, err := q.Exec(ctx, `INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at) VALUES ($1, $2::text::pg_lsn, now())
ON CONFLICT (slot_name) `+conflict, slot, lsn.String()); err != nil {
		return 0, fmt.Errorf("write checkpoint of slot %q: %w", slot, err)
	}
	return ReadCheckpoint(ctx, q, slot)
}

// HasCheckpoint reports whether slot has a checkpoint; false, without
// error, when the state schema does not exist yet.
func HasCheckpoint(ctx context.Context, q Querier, slot string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT to_regclass('walcount.checkpoint') IS NOT NULL`).Scan(&ok)
	if err != nil || !ok {
		return false, err
	}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM walcount.checkpoint WHERE slot_name = $1)`, slot).Scan(&ok); err != nil {
		return false, fmt.Errorf("read checkpoint of slot %q: %w", slot, err)
	}
	return ok, nil
}

// DeleteCheckpoint removes the checkpoint of slot.
func DeleteCheckpoint(ctx context.Context, q Querier, slot string) error {
	if _, err := q.Exec(ctx, `DELETE FROM walcount.checkpoint WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("delete checkpoint of slot %q: %w", slot, err)
	}
	return nil
}

// Access says what the current role may do with walcount's state.
type Access struct {
	// Exists is false when the checkpoint table does not exist.
	Exists bool
	// Usage is USAGE on the schema.
	Usage bool
	// Missing lists the privileges the role lacks on the state's tables
	// and sequences, as "SELECT, UPDATE on walcount.checkpoint".
	Missing []string
}

// AccessGrants are the statements that give role everything walcount does
// with its state: read and write every table, use the sequences, and the
// same on the tables and sequences that later migrations create, when the
// role that owns the state (the one that runs these statements and the
// migrations) creates them. A state schema that walcount's role made
// itself needs none of this: it owns every table.
func AccessGrants(role string) string {
	return fmt.Sprintf("GRANT USAGE ON SCHEMA walcount TO %[1]s; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO %[1]s; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO %[1]s; "+
		"ALTER DEFAULT PRIVILEGES IN SCHEMA walcount GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %[1]s; ALTER DEFAULT PRIVILEGES IN SCHEMA walcount GRANT USAGE, SELECT ON SEQUENCES TO %[1]s;", role)
}

// StateAccess reads the current role's privileges on walcount's state. It
// reads the catalogs directly: to_regclass would fail, not answer, for a
// role without USAGE on the schema.
func StateAccess(ctx context.Context, q Querier) (Access, error) {
	var a Access
	err := q.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'walcount' AND c.relname = 'checkpoint'),
       coalesce((SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = 'walcount'), false),
       coalesce((SELECT array_agg(m ORDER BY m) FROM (
           SELECT string_agg(p, ', ' ORDER BY p) || ' on walcount.' || c.relname AS m
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           CROSS JOIN LATERAL unnest(CASE WHEN c.relkind = 'S' THEN ARRAY['USAGE'] ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) AS p
           WHERE n.nspname = 'walcount' AND c.relkind IN ('r', 'S')
             AND NOT CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(c.oid, p) ELSE has_table_privilege(c.oid, p) END
           GROUP BY c.relname) AS missing), '{}')`).Scan(&a.Exists, &a.Usage, &a.Missing)
	if err != nil {
		return a, fmt.Errorf("read privileges on walcount's state: %w", err)
	}
	return a, nil
}

// SnapshotCheckpoint returns, inside a REPEATABLE READ transaction, the
// transaction's snapshot (pg_current_snapshot() as text) and W as that
// snapshot sees it. It must be the transaction's first statement: that
// fixes the snapshot every later statement uses (docs/design.md §5, step 3).
func SnapshotCheckpoint(ctx context.Context, tx pgx.Tx, slot string) (snapshot string, w LSN, err error) {
	err = tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text, (SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1)`, slot).Scan(&snapshot, &w)
	if err != nil {
		return "", 0, fmt.Errorf("read snapshot and checkpoint: %w", err)
	}
	return snapshot, w, nil
}

// LockCheckpoint takes the checkpoint row's lock in tx, as CompareAndSet
// does, without moving W or its time: a flush that applies carried deltas
// only (a piece of a big batch) keeps every other flush out with it. It
// reports false when W is not w.
func LockCheckpoint(ctx context.Context, tx pgx.Tx, slot string, w LSN) (bool, error) {
	rows, err := tx.Query(ctx, `SELECT 1 FROM walcount.checkpoint WHERE slot_name = $1 AND lsn = $2::text::pg_lsn FOR UPDATE`, slot, w.String())
	if err != nil {
		return false, fmt.Errorf("lock checkpoint: %w", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("lock checkpoint: %w", err)
	}
	return n == 1, nil
}
