package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/counter"
)

// Run statuses.
const (
	StatusPending = "pending"
	StatusRunning = "running"
	StatusDone    = "done"
	StatusFailed  = "failed"
)

// Run kinds.
const (
	KindManual    = "manual"
	KindScheduled = "scheduled"
	KindBackfill  = "backfill"
	// KindDirty repairs a dirty counter or dirty keys (design rule 14).
	KindDirty = "dirty"
)

// ErrLeaseLost means another daemon took the run over: its lease of this
// one expired (a stall longer than the lease).
var ErrLeaseLost = errors.New("another walcount took the reconciliation run over")

// Run is one reconciliation run as /status and walcount reconcile
// show it.
type Run struct {
	ID          int64      `json:"id"`
	Kind        string     `json:"kind"`
	Counters    []string   `json:"counters"`
	DryRun      bool       `json:"dry_run"`
	BatchSize   int        `json:"batch_size"`
	Status      string     `json:"status"`
	CurCounter  string     `json:"current_counter,omitempty"`
	LastKey     string     `json:"last_key,omitempty"`
	Total       int64      `json:"total_keys"`
	KeysChecked int64      `json:"keys_checked"`
	Drifted     int64      `json:"drifted"`
	Corrected   int64      `json:"corrected"`
	Error       string     `json:"error,omitempty"`
	StartedAt   time.Time  `json:"started_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// Owner names the daemon that executes the run, while its lease
	// lasts.
	Owner string `json:"owner,omitempty"`
	// Keys limits the run to these keys of its one counter; nil means
	// every key.
	Keys []string `json:"keys,omitempty"`
	// DirtyIDs are the dirty marks the run clears when it is done.
	DirtyIDs []int64 `json:"dirty_ids,omitempty"`
	// Drift lists drifted keys found (up to MaxDriftSamples).
	Drift []KeyDrift `json:"drift,omitempty"`
}

// KeyDrift is one key whose column is off.
type KeyDrift struct {
	Counter    string `json:"counter"`
	Key        string `json:"key"`
	Cached     int64  `json:"cached"`
	True       int64  `json:"true"`
	Correction int64  `json:"correction"`
}

// MaxDriftSamples bounds Run.Drift.
const MaxDriftSamples = 100

// Runs keeps the reconciliation runs and backfills of one slot in
// walcount.reconcile_runs and walcount.counters.
type Runs struct {
	q    Querier
	slot string
}

// NewRuns returns the run store of slot on q.
func NewRuns(q Querier, slot string) Runs { return Runs{q: q, slot: slot} }

const runCols = `id, kind, counters, dry_run, batch_size, status, coalesce(cur_counter, ''), coalesce(last_key, ''),
total, keys_checked, drifted, corrected, coalesce(error, ''), started_at, finished_at, coalesce(owner, ''), keys, dirty_ids`

func scanRun(row pgx.Row) (Run, error) {
	var r Run
	err := row.Scan(&r.ID, &r.Kind, &r.Counters, &r.DryRun, &r.BatchSize, &r.Status, &r.CurCounter, &r.LastKey,
		&r.Total, &r.KeysChecked, &r.Drifted, &r.Corrected, &r.Error, &r.StartedAt, &r.FinishedAt, &r.Owner, &r.Keys, &r.DirtyIDs)
	return r, err
}

// Create records a pending run.
func (s Runs) Create(ctx context.Context, kind string, counters []string, dry bool, batch int) (Run, error) {
	return s.CreateFor(ctx, Run{Kind: kind, Counters: counters, DryRun: dry, BatchSize: batch})
}

// CreateFor records a pending run of r's kind, counters, keys and dirty
// marks.
func (s Runs) CreateFor(ctx context.Context, r Run) (Run, error) {
	return scanRun(s.q.QueryRow(ctx, `INSERT INTO walcount.reconcile_runs (slot_name, kind, counters, dry_run, batch_size, status, keys, dirty_ids)
VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7) RETURNING `+runCols, s.slot, r.Kind, r.Counters, r.DryRun, r.BatchSize, r.Keys, r.DirtyIDs))
}

// Claim takes the oldest unfinished run that nobody holds (no owner, or a
// lease that expired) or that owner already holds, and gives owner a lease
// of lease on it. Two daemons never execute one run: the row lock and SKIP
// LOCKED let one of them claim it, and the other finds it held.
//
// streams says that owner streams the slot now. Only the daemon that
// streams can execute a run (a measurement needs its markers from the
// stream), and a slot streams to one connection at a time, so a run that
// another owner holds then belongs to a daemon that lost the slot (killed,
// or cut off): it is taken over at once, not after its lease. The daemon
// that held it can finish no measurement (its markers never arrive) and
// can save nothing (its saves match no row: ErrLeaseLost), exactly as
// when its lease expired.
func (s Runs) Claim(ctx context.Context, owner string, lease time.Duration, streams bool) (Run, bool, error) {
	r, err := scanRun(s.q.QueryRow(ctx, `UPDATE walcount.reconcile_runs SET owner = $2, lease_until = now() + $3::float8 * interval '1 second', updated_at = now()
WHERE id = (SELECT id FROM walcount.reconcile_runs
            WHERE slot_name = $1 AND status IN ('pending', 'running')
              AND (owner IS NULL OR owner = $2 OR lease_until < now() OR $4)
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING `+runCols, s.slot, owner, lease.Seconds(), streams))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("claim a reconcile run: %w", err)
	}
	return r, true, nil
}

// Unfinished returns the oldest run that did not finish, to resume it.
func (s Runs) Unfinished(ctx context.Context) (Run, bool, error) {
	r, err := scanRun(s.q.QueryRow(ctx, `SELECT `+runCols+` FROM walcount.reconcile_runs
WHERE slot_name = $1 AND status IN ('pending', 'running') ORDER BY id LIMIT 1`, s.slot))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

// Get returns the run id of this slot; ok is false when there is none.
func (s Runs) Get(ctx context.Context, id int64) (Run, bool, error) {
	r, err := scanRun(s.q.QueryRow(ctx, `SELECT `+runCols+` FROM walcount.reconcile_runs WHERE slot_name = $1 AND id = $2`, s.slot, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("read reconcile run %d: %w", id, err)
	}
	return r, true, nil
}

// LastFinished returns when the last run that completed ended.
func (s Runs) LastFinished(ctx context.Context) (time.Time, bool, error) {
	var t *time.Time
	err := s.q.QueryRow(ctx, `SELECT max(finished_at) FROM walcount.reconcile_runs WHERE slot_name = $1 AND status = 'done'`, s.slot).Scan(&t)
	if err != nil || t == nil {
		return time.Time{}, false, err
	}
	return *t, true, nil
}

// Release gives up owner's leases on unfinished runs, so that another
// walcount resumes them at once instead of after the lease: a daemon
// calls it when it stops.
func (s Runs) Release(ctx context.Context, owner string) error {
	if _, err := s.q.Exec(ctx, `UPDATE walcount.reconcile_runs SET owner = NULL, lease_until = NULL
WHERE slot_name = $1 AND owner = $2 AND status IN ('pending', 'running')`, s.slot, owner); err != nil {
		return fmt.Errorf("release reconcile runs: %w", err)
	}
	return nil
}

// Progress saves a run's figures and status and renews its owner's lease.
// A run that names an owner is saved only while that owner holds it: it
// fails with ErrLeaseLost once another daemon took it over, so that the
// record's figures are always the executing daemon's.
func (s Runs) Progress(ctx context.Context, r Run, lease time.Duration) error {
	tag, err := s.q.Exec(ctx, `UPDATE walcount.reconcile_runs SET status = $2, cur_counter = $3, last_key = $4,
total = $5, keys_checked = $6, drifted = $7, corrected = $8, error = nullif($9, ''), updated_at = now(),
finished_at = CASE WHEN $2 IN ('done', 'failed') THEN now() END,
lease_until = CASE WHEN $2 IN ('done', 'failed') THEN NULL ELSE now() + $11::float8 * interval '1 second' END
WHERE id = $1 AND (owner IS NULL AND $10 = '' OR owner = $10)`, r.ID, r.Status, r.CurCounter, r.LastKey, r.Total, r.KeysChecked, r.Drifted, r.Corrected, r.Error,
		r.Owner, lease.Seconds())
	if err != nil {
		return fmt.Errorf("save reconcile progress: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("save reconcile progress of run %d: %w", r.ID, ErrLeaseLost)
	}
	return nil
}

// NeedBackfill returns the counters that were never backfilled or whose
// definition changed.
func (s Runs) NeedBackfill(ctx context.Context, counters []counter.Counter) ([]string, error) {
	var out []string
	for _, c := range counters {
		var def string
		var at *time.Time
		err := s.q.QueryRow(ctx, `SELECT definition, backfilled_at FROM walcount.counters WHERE slot_name = $1 AND name = $2`, s.slot, c.Name).Scan(&def, &at)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && (def != c.Definition() || at == nil)) {
			out = append(out, c.Name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read counters: %w", err)
		}
	}
	return out, nil
}

// BackfillQueued records the definitions a backfill of cs is about to
// measure, none of them backfilled yet. A backfill that resumes after a
// restart compares them with the configured ones (DefinitionChanged): a
// counter whose definition changed since must be measured again from its
// first key.
func (s Runs) BackfillQueued(ctx context.Context, cs []counter.Counter) error {
	for _, c := range cs {
		_, err := s.q.Exec(ctx, `INSERT INTO walcount.counters (slot_name, name, definition, backfilled_at) VALUES ($1, $2, $3, NULL)
ON CONFLICT (slot_name, name) DO UPDATE SET definition = excluded.definition, backfilled_at = NULL`, s.slot, c.Name, c.Definition())
		if err != nil {
			return fmt.Errorf("record the backfill of %s: %w", c.Name, err)
		}
	}
	return nil
}

// DefinitionChanged reports whether c's definition differs from the one
// recorded for it when its backfill was queued or done (no record: no).
func (s Runs) DefinitionChanged(ctx context.Context, c counter.Counter) (bool, error) {
	var def string
	err := s.q.QueryRow(ctx, `SELECT definition FROM walcount.counters WHERE slot_name = $1 AND name = $2`, s.slot, c.Name).Scan(&def)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read counters: %w", err)
	}
	return def != c.Definition(), nil
}

// Backfilled records that c was backfilled with its current definition.
func (s Runs) Backfilled(ctx context.Context, c counter.Counter) error {
	_, err := s.q.Exec(ctx, `INSERT INTO walcount.counters (slot_name, name, definition, backfilled_at) VALUES ($1, $2, $3, now())
ON CONFLICT (slot_name, name) DO UPDATE SET definition = excluded.definition, backfilled_at = excluded.backfilled_at`, s.slot, c.Name, c.Definition())
	if err != nil {
		return fmt.Errorf("record backfill of %s: %w", c.Name, err)
	}
	return nil
}

// Forget deletes what the slot keeps for counters that are not in kept
// (the configured ones, generated counters included): their backfill
// records, dirty marks, saved partitions and carried deltas, and returns
// the names it forgot. A removed counter's column is nobody's any more,
// so its carried deltas have nowhere to go; and a record of its backfill
// would make a counter of that name added again later (whose column
// changed meanwhile without walcount) look backfilled already. It runs
// in one transaction that holds the slot's checkpoint row, as a flush
// does, so that no flush writes carried deltas in between.
func (s Runs) Forget(ctx context.Context, db Beginner, kept []string) ([]string, error) {
	if kept == nil {
		kept = []string{}
	}
	var forgot []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM walcount.checkpoint WHERE slot_name = $1 FOR UPDATE`, s.slot); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
WITH c AS (DELETE FROM walcount.counters WHERE slot_name = $1 AND name <> ALL ($2) RETURNING name),
     d AS (DELETE FROM walcount.dirty WHERE slot_name = $1 AND counter <> ALL ($2) RETURNING counter),
     p AS (DELETE FROM walcount.partitions WHERE slot_name = $1 AND counter <> ALL ($2) RETURNING counter),
     k AS (DELETE FROM walcount.carried WHERE slot_name = $1 AND counter <> ALL ($2) RETURNING counter)
SELECT name FROM c UNION SELECT counter FROM d UNION SELECT counter FROM p UNION SELECT counter FROM k ORDER BY 1`, s.slot, kept)
		if err != nil {
			return err
		}
		forgot, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("forget the counters removed from the configuration: %w", err)
	}
	return forgot, nil
}

// KeptRuns is how many finished runs (done or failed) of a slot
// walcount.reconcile_runs keeps; Prune deletes the older ones. Every
// repair and every slot loss adds a run: kept forever, the table grew
// without bound (the soak's hour added 53).
const KeptRuns = 100

// Prune deletes the slot's finished runs but the newest keep; pending and
// running runs stay. It returns how many it deleted.
func (s Runs) Prune(ctx context.Context, keep int) (int64, error) {
	tag, err := s.q.Exec(ctx, `DELETE FROM walcount.reconcile_runs
WHERE slot_name = $1 AND status IN ('done', 'failed') AND id NOT IN (
  SELECT id FROM walcount.reconcile_runs WHERE slot_name = $1 AND status IN ('done', 'failed') ORDER BY id DESC LIMIT $2)`, s.slot, keep)
	if err != nil {
		return 0, fmt.Errorf("prune walcount.reconcile_runs: %w", err)
	}
	return tag.RowsAffected(), nil
}
