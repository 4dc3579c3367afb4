package state

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Carried is one key whose delta a flush did not apply and carried to the
// next flush (walcount.carried, design rule 2): its target row was locked
// by another transaction (deferred), or its UPDATE failed on the row's
// data (parked, with the error, retried from RetryAt on).
type Carried struct {
	Counter string    `json:"counter"`
	Key     string    `json:"key"`
	Delta   int64     `json:"delta"`
	Since   time.Time `json:"since"`
	// Parked is the error that parked the key; empty for a deferred key.
	Parked  string     `json:"parked_error,omitempty"`
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// Due is true when a parked key may be tried again (RetryAt passed),
	// by the server's clock; always true for a deferred key.
	Due bool `json:"-"`
}

// LoadCarried returns the slot's carried keys. Run it in the flush's
// transaction, after the checkpoint's compare-and-set: the row lock it
// took keeps every other flush of the slot out.
func LoadCarried(ctx context.Context, q Querier, slot string) ([]Carried, error) {
	rows, err := q.Query(ctx, `SELECT counter, key, delta, since, coalesce(parked_error, ''), retry_at,
       parked_error IS NULL OR retry_at IS NULL OR retry_at <= now()
FROM walcount.carried WHERE slot_name = $1`, slot)
	if err != nil {
		return nil, fmt.Errorf("read carried deltas: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Carried, error) {
		var c Carried
		err := row.Scan(&c.Counter, &c.Key, &c.Delta, &c.Since, &c.Parked, &c.RetryAt, &c.Due)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read carried deltas: %w", err)
	}
	return out, nil
}

// SaveCarried replaces the slot's carried keys with keys, in the flush's
// transaction. A key with a zero Since is carried from now on; a parked
// key without RetryAt is retried after retry.
func SaveCarried(ctx context.Context, q Querier, slot string, keys []Carried, retry time.Duration) error {
	if _, err := q.Exec(ctx, `DELETE FROM walcount.carried WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("write carried deltas: %w", err)
	}
	return UpsertCarried(ctx, q, slot, keys, retry)
}

// UpdateCarried brings the slot's carried keys from was (as LoadCarried
// read them in this transaction) to now, writing only the keys that
// changed: a flush that carries one key among many touches its row only.
func UpdateCarried(ctx context.Context, q Querier, slot string, was, now []Carried, retry time.Duration) error {
	type id struct{ counter, key string }
	old := make(map[id]Carried, len(was))
	for _, c := range was {
		old[id{c.Counter, c.Key}] = c
	}
	var changed []Carried
	for _, c := range now {
		k := id{c.Counter, c.Key}
		o, ok := old[k]
		delete(old, k)
		if ok && o.Delta == c.Delta && o.Parked == c.Parked && c.RetryAt != nil && o.RetryAt != nil && o.RetryAt.Equal(*c.RetryAt) {
			continue
		}
		if ok && c.Parked == "" && o.Parked == "" && o.Delta == c.Delta {
			continue
		}
		changed = append(changed, c)
	}
	if len(old) > 0 || len(changed) > 0 {
		counters, keys := make([]string, 0, len(old)+len(changed)), make([]string, 0, len(old)+len(changed))
		for k := range old {
			counters, keys = append(counters, k.counter), append(keys, k.key)
		}
		for _, c := range changed {
			counters, keys = append(counters, c.Counter), append(keys, c.Key)
		}
		if _, err := q.Exec(ctx, `DELETE FROM walcount.carried c USING unnest($2::text[], $3::text[]) AS u(c, k)
WHERE c.slot_name = $1 AND c.counter = u.c AND c.key = u.k`, slot, counters, keys); err != nil {
			return fmt.Errorf("write carried deltas: %w", err)
		}
	}
	return UpsertCarried(ctx, q, slot, changed, retry)
}

// UpsertCarried inserts keys, which the slot does not carry yet.
func UpsertCarried(ctx context.Context, q Querier, slot string, keys []Carried, retry time.Duration) error {
	if len(keys) == 0 {
		return nil
	}
	n := len(keys)
	counters, ks, errs := make([]string, n), make([]string, n), make([]*string, n)
	deltas := make([]int64, n)
	since, retryAt := make([]*time.Time, n), make([]*time.Time, n)
	for i, c := range keys {
		counters[i], ks[i], deltas[i] = c.Counter, c.Key, c.Delta
		if !c.Since.IsZero() {
			since[i] = &c.Since
		}
		if c.Parked != "" {
			e := c.Parked
			errs[i] = &e
			retryAt[i] = c.RetryAt
		}
	}
	_, err := q.Exec(ctx, `INSERT INTO walcount.carried (slot_name, counter, key, delta, since, parked_error, retry_at)
SELECT $1, u.c, u.k, u.d, coalesce(u.s, now()), u.e,
       CASE WHEN u.e IS NOT NULL THEN coalesce(u.r, now() + $8::float8 * interval '1 second') END
FROM unnest($2::text[], $3::text[], $4::bigint[], $5::timestamptz[], $6::text[], $7::timestamptz[]) AS u(c, k, d, s, e, r)`,
		slot, counters, ks, deltas, since, errs, retryAt, retry.Seconds())
	if err != nil {
		return fmt.Errorf("write %d carried deltas: %w", n, err)
	}
	return nil
}

// DropCarried forgets the carried deltas of counters (a TRUNCATE of their
// source resets them), in the barrier's transaction.
func DropCarried(ctx context.Context, q Querier, slot string, counters []string) error {
	if _, err := q.Exec(ctx, `DELETE FROM walcount.carried WHERE slot_name = $1 AND counter = ANY ($2)`, slot, counters); err != nil {
		return fmt.Errorf("drop carried deltas: %w", err)
	}
	return nil
}

// CarriedSummary is what /status and the metrics show of the carried keys.
type CarriedSummary struct {
	// Deferred and Parked count the keys of each kind; Delta sums the
	// absolute deltas carried.
	Deferred int64 `json:"deferred_keys"`
	Parked   int64 `json:"parked_keys"`
	// Oldest is the deferred key carried the longest, OldestAge how
	// long (by the server's clock); nil without deferred keys.
	Oldest    *Carried `json:"oldest_deferred,omitempty"`
	OldestAge float64  `json:"oldest_deferred_age_seconds"`
	// ParkedKeys lists parked keys, oldest first (at most MaxParkedShown).
	ParkedKeys []Carried `json:"parked,omitempty"`
}

// MaxParkedShown bounds CarriedSummary.ParkedKeys.
const MaxParkedShown = 20

// ReadCarriedSummary reads the slot's carried keys for /status. A plain
// read: it never waits for a flush.
func ReadCarriedSummary(ctx context.Context, q Querier, slot string) (CarriedSummary, error) {
	var s CarriedSummary
	err := q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE parked_error IS NULL), count(*) FILTER (WHERE parked_error IS NOT NULL)
FROM walcount.carried WHERE slot_name = $1`, slot).Scan(&s.Deferred, &s.Parked)
	if err != nil {
		return s, fmt.Errorf("read carried deltas: %w", err)
	}
	if s.Deferred > 0 {
		var c Carried
		err := q.QueryRow(ctx, `SELECT counter, key, delta, since, extract(epoch FROM clock_timestamp() - since)::float8
FROM walcount.carried WHERE slot_name = $1 AND parked_error IS NULL ORDER BY since, counter, key LIMIT 1`, slot).
			Scan(&c.Counter, &c.Key, &c.Delta, &c.Since, &s.OldestAge)
		if err != nil {
			return s, fmt.Errorf("read carried deltas: %w", err)
		}
		c.Due = true
		s.Oldest = &c
		s.OldestAge = max(s.OldestAge, 0)
	}
	if s.Parked > 0 {
		rows, err := q.Query(ctx, `SELECT counter, key, delta, since, parked_error, retry_at
FROM walcount.carried WHERE slot_name = $1 AND parked_error IS NOT NULL ORDER BY since, counter, key LIMIT $2`, slot, MaxParkedShown)
		if err != nil {
			return s, fmt.Errorf("read parked keys: %w", err)
		}
		s.ParkedKeys, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Carried, error) {
			var c Carried
			err := row.Scan(&c.Counter, &c.Key, &c.Delta, &c.Since, &c.Parked, &c.RetryAt)
			return c, err
		})
		if err != nil {
			return s, fmt.Errorf("read parked keys: %w", err)
		}
	}
	return s, nil
}

// CarriedCursor is a position in the slot's carried keys, in the order of
// (counter, length(key), key): numeric order for integer keys (index
// carried_drain_order); the zero value lies before the first.
type CarriedCursor struct {
	Counter, Key string
	Started      bool
	// Counters, when not nil, limits the pages to these counters' keys,
	// or with Others to every other counter's keys.
	Counters []string
	Others   bool
}

// LoadCarriedPage returns up to limit of the slot's carried keys after
// cursor, in CarriedCursor's order, and the cursor after them. Run it in a
// flush's transaction, after the checkpoint's row lock was taken.
func LoadCarriedPage(ctx context.Context, q Querier, slot string, after CarriedCursor, limit int) ([]Carried, CarriedCursor, error) {
	// Two statements, not one with an OR: a generic plan could not use
	// the cursor as an index bound, and every page would scan from the
	// first key.
	const cols = `SELECT counter, key, delta, since, coalesce(parked_error, ''), retry_at,
       parked_error IS NULL OR retry_at IS NULL OR retry_at <= now()
FROM walcount.carried WHERE slot_name = $1`
	query, args := cols, []any{slot, limit}
	if after.Counters != nil {
		args = append(args, after.Counters)
		if after.Others {
			query += ` AND counter <> ALL ($3::text[])`
		} else {
			query += ` AND counter = ANY ($3::text[])`
		}
	}
	if after.Started {
		n := len(args)
		args = append(args, after.Counter, after.Key)
		query += fmt.Sprintf(` AND (counter, length(key), key) > ($%d::text, length($%d::text), $%d::text)`, n+1, n+2, n+2)
	}
	rows, err := q.Query(ctx, query+` ORDER BY counter, length(key), key LIMIT $2`, args...)
	if err != nil {
		return nil, after, fmt.Errorf("read carried deltas: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Carried, error) {
		var c Carried
		err := row.Scan(&c.Counter, &c.Key, &c.Delta, &c.Since, &c.Parked, &c.RetryAt, &c.Due)
		return c, err
	})
	if err != nil {
		return nil, after, fmt.Errorf("read carried deltas: %w", err)
	}
	if len(out) > 0 {
		last := out[len(out)-1]
		after = CarriedCursor{Counter: last.Counter, Key: last.Key, Started: true, Counters: after.Counters, Others: after.Others}
	}
	return out, after, nil
}

// StageTable is the temporary table into which a big flush copies its
// batch (field, delta) before StageCarried merges it into walcount.carried.
const StageTable = "walcount_staged"

// CreateStage creates StageTable in tx, dropped at its commit.
func CreateStage(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE `+StageTable+` (field text NOT NULL, delta bigint NOT NULL) ON COMMIT DROP`); err != nil {
		return fmt.Errorf("stage the batch: %w", err)
	}
	return nil
}

// CopyStage copies one page of a batch into StageTable. A field may come
// twice (a page read again), always with the same delta.
func CopyStage(ctx context.Context, tx pgx.Tx, fields []string, deltas []int64) error {
	_, err := tx.CopyFrom(ctx, pgx.Identifier{StageTable}, []string{"field", "delta"},
		pgx.CopyFromSlice(len(fields), func(i int) ([]any, error) { return []any{fields[i], deltas[i]}, nil }))
	if err != nil {
		return fmt.Errorf("stage the batch: %w", err)
	}
	return nil
}

// StageCarried merges the staged batch into the slot's carried keys, for
// the counters named (the deltas of any other counter are dropped: it is
// no longer configured), and reports how many distinct fields were staged,
// how many were merged and how many dropped. A staged delta joins a key
// already carried (deferred or parked alike); a sum of zero deletes the
// key.
func StageCarried(ctx context.Context, tx pgx.Tx, slot string, counters []string) (staged, merged, dropped int64, err error) {
	err = tx.QueryRow(ctx, `SELECT count(DISTINCT field),
       count(DISTINCT field) FILTER (WHERE split_part(field, ':', 1) <> ALL ($1)) FROM `+StageTable, counters).Scan(&staged, &dropped)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("stage the batch: %w", err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO walcount.carried AS c (slot_name, counter, key, delta)
SELECT $1, s.counter, s.key, s.delta
FROM (SELECT DISTINCT split_part(field, ':', 1) AS counter, substr(field, strpos(field, ':') + 1) AS key, delta
      FROM `+StageTable+` WHERE delta <> 0) AS s
WHERE s.counter = ANY ($2)
ON CONFLICT (slot_name, counter, key) DO UPDATE SET delta = c.delta + excluded.delta`, slot, counters)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("stage the batch: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM walcount.carried WHERE slot_name = $1 AND delta = 0`, slot); err != nil {
		return 0, 0, 0, fmt.Errorf("stage the batch: %w", err)
	}
	return staged, tag.RowsAffected(), dropped, nil
}
