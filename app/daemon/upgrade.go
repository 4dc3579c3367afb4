package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/operator"
	"github.com/walcount/walcount/state"
)

// Upgrades (docs/upgrade.md). A walcount started on an older state schema
// migrates it forward by itself, so that a package upgrade, which restarts
// the service, needs no other step. It does so only while it holds the
// slot: it takes the slot first (START_REPLICATION, which fails while
// another walcount streams it), then migrates in one transaction under
// state's advisory lock, then goes on with the session on that stream.
//
// So while an older walcount of the same slot streams (the active half of
// an HA pair whose standby was upgraded first), the new one waits as a
// standby and changes nothing: the old one keeps writing its own schema.
// Once the old one stops, the new one takes the slot, migrates and streams.
// An old walcount that starts again afterwards reads a version newer than
// it knows and refuses to run (every release does, before it takes the
// slot); one that was between that check and START_REPLICATION finds the
// slot held and checks again. The two versions never write at once.
//
// Every migration walcount ships keeps the checkpoint, the carried deltas
// and every other row (they add tables, columns and an index), and is
// idempotent: a second walcount, or a walcount setup, that waits on the
// lock finds the schema migrated and does nothing.

// upgradeState migrates an older state schema when this daemon may, and
// returns the stream it holds the slot with (nil when the schema needed
// nothing: the session connects as usual). An error of another version,
// or of no schema, is left to state.CheckVersion.
func (d *Daemon) upgradeState(ctx context.Context, silence time.Duration) (*cdc.Stream, error) {
	from, err := state.ReadVersion(ctx, d.pool)
	if err != nil || from >= state.Version {
		return nil, nil
	}
	w, err := state.ReadCheckpoint(ctx, d.pool, d.cfg.Slot)
	if err != nil {
		return nil, err
	}
	if d.opt.replayFromSlot {
		w = 0
	}
	// Say who may migrate before taking the slot: a role that may not
	// should stop at once, standby or not.
	if err := d.mayMigrate(ctx, from); err != nil {
		return nil, err
	}
	stream, err := d.connectStream(ctx, w, silence)
	if err != nil {
		if errors.Is(err, cdc.ErrSlotInUse) {
			return nil, fmt.Errorf("%w; walcount's state schema is version %d: this walcount migrates it to version %d once it has the slot (the walcount streaming it now, an older release, keeps it as it is)", err, from, state.Version)
		}
		return nil, err
	}
	if err := d.migrate(ctx); err != nil {
		stream.Close()
		return nil, err
	}
	return stream, nil
}

// mayMigrate returns a *state.MigrationPrivilegeError when the current role
// may not migrate the schema of version from.
func (d *Daemon) mayMigrate(ctx context.Context, from int) error {
	m, err := state.ReadMigrator(ctx, d.pool)
	if err != nil {
		return err
	}
	if m.May {
		return nil
	}
	return &state.MigrationPrivilegeError{From: from, Migrator: m, Statements: d.upgradeSQL(from, m)}
}

// upgradeSQL is what the owner of the state runs for this deployment
// (state.UpgradeScript).
func (d *Daemon) upgradeSQL(from int, m state.Migrator) []string {
	return state.UpgradeScript(from, m.Role, d.cfg.Publication)
}

func publishMessagesSQL(pub string) string { return state.PublishMessagesSQL(pub) }

// PublishPrivilegeError is a state schema migrated to version 3 or later
// whose publication lacks walcount.messages, which walcount's role may not
// add: the owner of the publication must (design rule 18).
type PublishPrivilegeError struct {
	Publication, Owner, Role string
	Err                      error
}

func (e *PublishPrivilegeError) Error() string {
	return fmt.Sprintf("walcount migrated its state schema to version %d, whose messages travel as rows of %s, but role %s may not add that table to publication %s (%v): "+
		"have role %s (the owner of the publication, a member of role %s: GRANT %s TO %s) run this statement, then start walcount again:\n%s;",
		state.Version, cdc.MessageTable, e.Role, e.Publication, e.Err, e.Owner, e.Role,
		pgx.Identifier{e.Role}.Sanitize(), pgx.Identifier{e.Owner}.Sanitize(), publishMessagesSQL(e.Publication))
}

func (e *PublishPrivilegeError) Unwrap() error { return e.Err }

// NeedsOperator stops the daemon.
func (e *PublishPrivilegeError) NeedsOperator() bool { return true }

// OperatorClass says a person must run the statement.
func (e *PublishPrivilegeError) OperatorClass() operator.Class { return operator.Privilege }

// errPublish marks the publication step's refusal.
type errPublish struct{ err error }

func (e errPublish) Error() string { return e.err.Error() }
func (e errPublish) Unwrap() error { return e.err }

// migrate runs the migrations and what walcount setup would add to an
// older deployment's state with them, in one transaction: the claims on
// the counter columns and the publication the slot reads (version 2), and
// walcount.messages in the publication (version 3). A refusal of the
// migration for want of a privilege rolls it all back and returns a
// *state.MigrationPrivilegeError; one of the publication alone commits the
// migrated state without it and returns a *PublishPrivilegeError, as
// walcount setup stops before the owner's step.
func (d *Daemon) migrate(ctx context.Context) error {
	from, to, err := d.migrateOnce(ctx, true)
	var pub errPublish
	if errors.As(err, &pub) && isPrivilege(err) {
		owner := "the owner of the publication"
		_ = d.pool.QueryRow(ctx, `SELECT pubowner::regrole::text FROM pg_publication WHERE pubname = $1`, d.cfg.Publication).Scan(&owner)
		var role string
		_ = d.pool.QueryRow(ctx, `SELECT current_user::text`).Scan(&role)
		perr := &PublishPrivilegeError{Publication: d.cfg.Publication, Owner: owner, Role: role, Err: pub.err}
		if from, to, err = d.migrateOnce(ctx, false); err == nil {
			d.logMigrated(from, to)
			return perr
		}
	}
	if isPrivilege(err) {
		m, merr := state.ReadMigrator(ctx, d.pool)
		if merr != nil {
			return errors.Join(err, merr)
		}
		return &state.MigrationPrivilegeError{From: from, Migrator: m, Statements: d.upgradeSQL(from, m), Err: err}
	}
	if err != nil {
		return err
	}
	d.logMigrated(from, to)
	return nil
}

func (d *Daemon) logMigrated(from, to int) {
	if from < to {
		d.log.Info("migrated walcount's state schema", zap.Int("from_version", from), zap.Int("to_version", to))
	}
}

func isPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// migrateOnce is one try of migrate's transaction, with the publication
// step or without it.
func (d *Daemon) migrateOnce(ctx context.Context, publish bool) (from, to int, err error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate state schema: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if from, to, err = state.MigrateIn(ctx, tx); err != nil {
		return from, to, err
	}
	if from < to {
		if err := d.completeUpgrade(ctx, tx, from, publish); err != nil {
			return from, to, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return from, to, fmt.Errorf("migrate state schema: commit: %w", err)
	}
	return from, to, nil
}

// completeUpgrade is, in the migration's transaction, what setup would
// have made of walcount's state for a schema of version from.
func (d *Daemon) completeUpgrade(ctx context.Context, tx pgx.Tx, from int, publish bool) error {
	if from < 2 {
		if err := state.SetPublication(ctx, tx, d.cfg.Slot, d.cfg.Publication); err != nil {
			return err
		}
		if err := state.Claim(ctx, tx, d.cfg.Slot, d.cfg.Counters); err != nil {
			return err
		}
	}
	if from < 3 && publish {
		var published bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
WHERE pubname = $1 AND schemaname = 'walcount' AND tablename = 'messages')`, d.cfg.Publication).Scan(&published); err != nil {
			return fmt.Errorf("read publication %s: %w", d.cfg.Publication, err)
		}
		if !published {
			if _, err := tx.Exec(ctx, publishMessagesSQL(d.cfg.Publication)); err != nil {
				return errPublish{fmt.Errorf("publish %s: %w", cdc.MessageTable, err)}
			}
		}
	}
	return nil
}
