package state

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/operator"
)

// Schema is the name of walcount's state schema.
const Schema = "walcount"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded SQL file, applied in version order.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations are the embedded SQL files, named NNNN_what.sql, in order.
var migrations = func() []migration {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("state: migration file " + e.Name() + " is not named NNNN_what.sql")
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			panic(err)
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			panic(fmt.Sprintf("state: migration %s: want version %d", m.name, i+1))
		}
	}
	return out
}()

// Version is the schema version this walcount reads and writes.
var Version = len(migrations)

var (
	// ErrNotSetUp means the state schema or its tables do not exist.
	ErrNotSetUp = operator.NewError("walcount's state schema does not exist (run walcount setup)")
	// ErrSchemaVersion is wrapped when the state schema has a version this
	// walcount does not know.
	ErrSchemaVersion = operator.NewError("walcount's state schema has another version")
)

// Querier reads; *pgx.Conn, *pgxpool.Pool and pgx.Tx fit.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions; *pgx.Conn and *pgxpool.Pool fit.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ReadVersion returns the state schema's version: 0 when the schema has no
// version table (it was made before walcount recorded one), and ErrNotSetUp
// when there is no schema at all.
func ReadVersion(ctx context.Context, q Querier) (int, error) {
	var hasSchema, hasVersion bool
	err := q.QueryRow(ctx, `SELECT to_regnamespace('walcount') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'walcount' AND c.relname = 'schema_version')`).Scan(&hasSchema, &hasVersion)
	if err != nil {
		return 0, fmt.Errorf("read state schema version: %w", err)
	}
	if !hasSchema {
		return 0, ErrNotSetUp
	}
	if !hasVersion {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM walcount.schema_version`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read state schema version: %w", err)
	}
	return v, nil
}

// CheckVersion returns nil when the state schema is the version this
// walcount knows. Otherwise the error wraps ErrNotSetUp or ErrSchemaVersion
// and names the fix: walcount setup for an older schema (walcount run
// migrates one by itself, see app/daemon's upgrade.go), a newer walcount
// for a newer one (a *NewerError).
func CheckVersion(ctx context.Context, q Querier) error {
	v, err := ReadVersion(ctx, q)
	if err != nil {
		return err
	}
	switch {
	case v < Version:
		return fmt.Errorf("%w: it is version %d, this walcount needs version %d: walcount run migrates it once it holds the slot, or run walcount setup to migrate it (the checkpoint is kept)", ErrSchemaVersion, v, Version)
	case v > Version:
		return &NewerError{Found: v}
	}
	return nil
}

// NewerError is the state schema of a newer walcount: this one must
// neither read nor write it. It wraps ErrSchemaVersion and is of class
// operator.NewerState (exit 2: restarting this binary never helps).
type NewerError struct {
	// Found is the schema's version.
	Found int
}

func (e *NewerError) Error() string {
	return fmt.Sprintf("%s: it is version %d, newer than this walcount knows (%d): run the walcount release that migrated it, or a newer one", ErrSchemaVersion, e.Found, Version)
}

// Unwrap returns ErrSchemaVersion.
func (e *NewerError) Unwrap() error { return ErrSchemaVersion }

// OperatorClass says a person must run a newer walcount.
func (e *NewerError) OperatorClass() operator.Class { return operator.NewerState }

// Migrate creates the state schema or brings it forward to Version, in one
// transaction, and returns the versions it went from and to. It refuses a
// schema newer than this walcount knows.
func Migrate(ctx context.Context, db Beginner) (from, to int, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate state schema: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if from, to, err = MigrateIn(ctx, tx); err != nil {
		return from, to, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("migrate state schema: commit: %w", err)
	}
	return from, to, nil
}

// MigrateIn is Migrate inside the caller's transaction, which commits it
// (walcount setup does, with the rest of what it creates). An advisory
// lock keeps two setups from migrating at once.
func MigrateIn(ctx context.Context, tx pgx.Tx) (from, to int, err error) {
	// Any fixed key will do; this one spells "walcount".
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(8746912330451865460)`); err != nil {
		return 0, 0, fmt.Errorf("migrate state schema: lock: %w", err)
	}
	from, err = ReadVersion(ctx, tx)
	if errors.Is(err, ErrNotSetUp) {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA walcount`); err != nil {
			return 0, 0, fmt.Errorf("migrate state schema: %w", err)
		}
		from, err = 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("migrate state schema: %w", err)
	}
	if from > Version {
		return from, from, fmt.Errorf("migrate state schema: %w", &NewerError{Found: from})
	}
	if from == Version {
		return from, from, nil
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS walcount.schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- Every walcount role reads the version before anything else, whatever
-- privileges it was granted on the other tables.
GRANT SELECT ON walcount.schema_version TO PUBLIC`); err != nil {
		return 0, 0, fmt.Errorf("migrate state schema: %w", err)
	}
	for _, m := range migrations[from:] {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return 0, 0, fmt.Errorf("migrate state schema to version %d (%s): %w", m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO walcount.schema_version (version) VALUES ($1)`, m.version); err != nil {
			return 0, 0, fmt.Errorf("migrate state schema to version %d: %w", m.version, err)
		}
	}
	return from, Version, nil
}

// MigrationSQL returns the statements Migrate would run on a schema of
// version from, for walcount setup --print-sql.
func MigrationSQL(from int) []string {
	var out []string
	if from <= 0 {
		out = append(out, "CREATE SCHEMA IF NOT EXISTS walcount")
	}
	out = append(out, `CREATE TABLE IF NOT EXISTS walcount.schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`,
		`GRANT SELECT ON walcount.schema_version TO PUBLIC`)
	for _, m := range migrations[max(from, 0):] {
		out = append(out, strings.TrimSpace(m.sql), fmt.Sprintf("INSERT INTO walcount.schema_version (version) VALUES (%d)", m.version))
	}
	return out
}
