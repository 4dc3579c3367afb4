package setup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/events"
	replslot "github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// TeardownPlan lists what Teardown drops.
func TeardownPlan(slotName, publication string) []string {
	slot := slotName
	return []string{
		fmt.Sprintf("replication slot %q (SELECT %s('%s')) on the server it lives on: replication_url's (a hot standby that decodes) when it is set, else database_url's", slot, replslot.DropFunction, slot),
		fmt.Sprintf("walcount's state rows of slot %q: its checkpoint, reconciliation runs, dirty marks and the claim on its counter columns", slot),
		fmt.Sprintf("publication %q (DROP PUBLICATION %s), unless another slot reads it", publication, pgx.Identifier{publication}.Sanitize()),
		"schema walcount and its tables (DROP SCHEMA walcount CASCADE), once no other slot is left in it",
		fmt.Sprintf("redis keys %v, %v and the change events streams %s of the configured counters", buffer.KeysFor(slot).All(), events.Keys(slot), events.Stream(slot, "<counter>")),
		"what walcount's role may not drop (a publication or schema it does not own) is printed, with the SQL, for their owner",
		"kept, and listed with the statements that remove them: the counter columns and their values, the replica identity setup set (restored with --restore-replica-identity), the privileges granted to walcount's role, and the role",
	}
}

// TeardownOptions configure TeardownWith.
type TeardownOptions struct {
	Slot, Publication string
	// SlotConn, when set, is a connection to the server that holds the
	// slot (replication_url's, a hot standby or a pooler's direct
	// connection); nil means the connection teardown runs on.
	SlotConn *pgx.Conn
	// SlotServer names that server for the operator ("the hot standby
	// 10.0.0.2:5432"); empty says nothing.
	SlotServer string
	// Counters are the configured counters: their tables are where the
	// privileges granted to walcount's role are looked for.
	Counters []counter.Counter
	// RestoreIdentity gives each table whose replica identity setup set
	// to FULL the identity it had before, when the current role owns it
	// and no other slot is left; otherwise the statement is printed.
	RestoreIdentity bool
}

// TeardownResult says what Teardown did and what it left.
type TeardownResult struct {
	// Dropped lists what was dropped, for the operator.
	Dropped []string
	// Restored lists the replica identities given back.
	Restored []string
	// ForOwner are the statements that the current role may not run (it
	// does not own the object): their owner runs them, in this order.
	ForOwner []string
	// Kept lists what teardown leaves on purpose, each with the statement
	// that removes it and who runs it (see keptAfter).
	Kept []Leftover
}

// Leftover is something teardown leaves in the database.
type Leftover struct {
	// What it is, and why it stays.
	What string
	// SQL removes it; Who says which role may run it.
	SQL []string
	Who string
}

// sqlstateInsufficientPrivilege is what PostgreSQL answers a role that
// lacks a privilege.
const sqlstateInsufficientPrivilege = "42501"

// Teardown is TeardownWith for a slot on the server of conn.
func Teardown(ctx context.Context, conn *pgx.Conn, rdb redis.UniversalClient, slot, publication string) (TeardownResult, error) {
	return TeardownWith(ctx, conn, rdb, TeardownOptions{Slot: slot, Publication: publication})
}

// TeardownWith removes one deployment: its slot, wherever it lives, so
// that no abandoned slot pins WAL (a slot left on a hot standby also holds
// back, through hot_standby_feedback, the primary's catalog xmin), its
// state rows and column claims, its publication when no other slot reads
// it, walcount's schema when no other slot is left, and its Redis keys.
// Other deployments on the same database keep running. It is idempotent.
// A slot in use by a running walcount cannot be dropped: stop the daemon
// first.
//
// What the current role may not drop, because it does not own it (a
// publication the tables' owner made and kept, a schema another role
// made), is not an error: it is returned in ForOwner, for the owner to
// run. What teardown leaves on purpose is returned in Kept.
func TeardownWith(ctx context.Context, conn *pgx.Conn, rdb redis.UniversalClient, opt TeardownOptions) (TeardownResult, error) {
	var res TeardownResult
	slot, publication := opt.Slot, opt.Publication
	slotConn := opt.SlotConn
	if slotConn == nil {
		slotConn = conn
	}
	where := ""
	if opt.SlotServer != "" {
		where = " on " + opt.SlotServer
	}
	slotDropped, err := replslot.DropIfExists(ctx, slotConn, slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlstateInsufficientPrivilege:
		res.ForOwner = append(res.ForOwner, fmt.Sprintf("SELECT %s(%s); -- on the server of the slot%s; needs REPLICATION or superuser", replslot.DropFunction, quoteLiteral(slot), where))
	case err != nil:
		return res, fmt.Errorf("drop replication slot %q%s (is walcount run still running?): %w", slot, where, err)
	case slotDropped:
		res.Dropped = append(res.Dropped, fmt.Sprintf("slot %q%s", slot, where))
	}
	var elsewhere []Leftover
	if slotConn != conn {
		// A slot of that name on database_url's server too (made before
		// replication_url named another server) is not the one walcount
		// reads: it is named, never dropped on a guess.
		if exists, err := replslot.Exists(ctx, conn, slot); err == nil && exists {
			elsewhere = append(elsewhere, Leftover{
				What: fmt.Sprintf("a replication slot %q on database_url's server as well, which this walcount does not read (replication_url names another server); it pins WAL there unless something else reads it", slot),
				SQL:  []string{fmt.Sprintf("SELECT %s(%s);", replslot.DropFunction, quoteLiteral(slot))},
				Who:  "a role with REPLICATION on database_url's server, once nothing reads it",
			})
		}
	}
	var forOwner, dropped, restored []string
	var kept []Leftover
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		forOwner, dropped, restored, kept = nil, nil, nil, nil
		others, pubShared := 0, false
		var idents []state.ReplicaIdentity
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
			if idents, err = state.ReadIdentities(ctx, tx); err != nil {
				return err
			}
		}
		if others == 0 {
			// The last slot gone: the identities setup changed are
			// walcount's no more.
			var err error
			if restored, kept, err = restoreIdentities(ctx, tx, idents, opt.RestoreIdentity); err != nil {
				return err
			}
		}
		pub := pgx.Identifier{publication}.Sanitize()
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
			more, err := keptAfter(ctx, tx, opt.Counters)
			if err != nil {
				return err
			}
			kept = append(kept, more...)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.ForOwner = append(res.ForOwner, forOwner...)
	res.Dropped = append(res.Dropped, dropped...)
	res.Restored, res.Kept = restored, append(elsewhere, kept...)
	if rdb != nil {
		if err := buffer.New(rdb, slot).Drop(ctx); err != nil {
			return res, err
		}
		if err := events.Drop(ctx, rdb, slot, opt.Counters); err != nil {
			return res, err
		}
		res.Dropped = append(res.Dropped, "the Redis keys")
	}
	return res, nil
}
