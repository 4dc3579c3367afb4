package setup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	replslot "github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// TeardownPlan lists what Teardown drops.
func TeardownPlan(slotName, publication string) []string {
	slot := slotName
	return []string{
		fmt.Sprintf("replication slot %q (SELECT %s('%s'))", slot, replslot.DropFunction, slot),
		fmt.Sprintf("walcount's state rows of slot %q: its checkpoint, reconciliation runs, dirty marks and the claim on its counter columns", slot),
		fmt.Sprintf("publication %q (DROP PUBLICATION %s), unless another slot reads it", publication, pgx.Identifier{publication}.Sanitize()),
		"schema walcount and its tables (DROP SCHEMA walcount CASCADE), once no other slot is left in it",
		fmt.Sprintf("redis keys %v", buffer.KeysFor(slot).All()),
		"what walcount's role may not drop (a publication or schema it does not own) is printed, with the SQL, for their owner",
	}
}

// TeardownResult says what Teardown left to the owner.
type TeardownResult struct {
	// Dropped lists what was dropped, for the operator.
	Dropped []string
	// ForOwner are the statements that the current role may not run (it
	// does not own the object): their owner runs them, in this order.
	ForOwner []string
}

// sqlstateInsufficientPrivilege is what PostgreSQL answers a role that
// lacks a privilege.
const sqlstateInsufficientPrivilege = "42501"

// Teardown removes one deployment: its slot, so that no abandoned slot
// pins WAL, its state rows and column claims, its publication when no
// other slot reads it, walcount's schema when no other slot is left, and
// its Redis keys. Other deployments on the same database keep running. It
// is idempotent. A slot in use by a running walcount cannot be dropped:
// stop the daemon first.
//
// What the current role may not drop, because it does not own it (a
// publication the tables' owner made and kept, a schema another role
// made), is not an error: it is returned in ForOwner, for the owner to
// run.
func Teardown(ctx context.Context, conn *pgx.Conn, rdb redis.UniversalClient, slot, publication string) (TeardownResult, error) {
	var res TeardownResult
	slotDropped, err := replslot.DropIfExists(ctx, conn, slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlstateInsufficientPrivilege:
		res.ForOwner = append(res.ForOwner, fmt.Sprintf("SELECT %s(%s); -- needs REPLICATION or superuser", replslot.DropFunction, quoteLiteral(slot)))
	case err != nil:
		return res, fmt.Errorf("drop replication slot %q (is walcount run still running?): %w", slot, err)
	case slotDropped:
		res.Dropped = append(res.Dropped, fmt.Sprintf("slot %q", slot))
	}
	pub := pgx.Identifier{publication}.Sanitize()
	var forOwner, dropped []string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		forOwner, dropped = nil, nil
		others, pubShared := 0, false
		switch _, err := state.ReadVersion(ctx, tx); {
		case errors.Is(err, state.ErrNotSetUp):
		case err != nil:
			return err
		default:
			// An older schema is brought forward first, so that its rows
			// are found where this walcount looks; a newer one is left to
			// the walcount that made it.
			if _, _, err := state.MigrateIn(ctx, tx); err != nil {
				return fmt.Errorf("teardown: %w", err)
			}
			if others, pubShared, err = state.Release(ctx, tx, slot, publication); err != nil {
				return err
			}
			dropped = append(dropped, fmt.Sprintf("the state rows of slot %q", slot))
		}
		if !pubShared {
			owns, exists, err := ownsPublication(ctx, tx, publication)
			switch {
			case err != nil:
				return err
			case exists && owns:
				if _, err := tx.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pub); err != nil {
					return fmt.Errorf("drop publication: %w", err)
				}
				dropped = append(dropped, fmt.Sprintf("publication %q", publication))
			case exists:
				forOwner = append(forOwner, "DROP PUBLICATION IF EXISTS "+pub+";")
			}
		}
		if others == 0 {
			var exists, owns bool
			err := tx.QueryRow(ctx, `SELECT true, pg_has_role(current_user, nspowner, 'USAGE') FROM pg_namespace WHERE nspname = 'walcount'`).Scan(&exists, &owns)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return fmt.Errorf("read the owner of schema walcount: %w", err)
			case owns:
				if _, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS walcount CASCADE"); err != nil {
					return fmt.Errorf("drop schema walcount: %w", err)
				}
				dropped = append(dropped, "schema walcount")
			default:
				forOwner = append(forOwner, "DROP SCHEMA IF EXISTS walcount CASCADE;")
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.ForOwner = append(res.ForOwner, forOwner...)
	res.Dropped = append(res.Dropped, dropped...)
	if rdb != nil {
		if err := buffer.New(rdb, slot).Drop(ctx); err != nil {
			return res, err
		}
		res.Dropped = append(res.Dropped, "the Redis keys")
	}
	return res, nil
}
