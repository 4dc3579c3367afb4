package setup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/state"
)

// TeardownPlan lists what Teardown drops.
func TeardownPlan(slot, publication string) []string {
	return []string{
		fmt.Sprintf("replication slot %q (SELECT pg_drop_replication_slot('%s'))", slot, slot),
		fmt.Sprintf("walcount's state rows of slot %q: its checkpoint, reconciliation runs, dirty marks and the claim on its counter columns", slot),
		fmt.Sprintf("publication %q (DROP PUBLICATION %s), unless another slot reads it", publication, pgx.Identifier{publication}.Sanitize()),
		"schema walcount and its tables (DROP SCHEMA walcount CASCADE), once no other slot is left in it",
		fmt.Sprintf("redis keys %v", buffer.KeysFor(slot).All()),
	}
}

// Teardown removes one deployment: its slot, so that no abandoned slot
// pins WAL, its state rows and column claims, its publication when no
// other slot reads it, walcount's schema when no other slot is left, and
// its Redis keys. Other deployments on the same database keep running. It
// is idempotent. A slot in use by a running walcount cannot be dropped:
// stop the daemon first.
func Teardown(ctx context.Context, conn *pgx.Conn, rdb redis.UniversalClient, slot, publication string) error {
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("drop replication slot %q (is walcount run still running?): %w", slot, err)
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
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
		}
		if !pubShared {
			if _, err := tx.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{publication}.Sanitize()); err != nil {
				return fmt.Errorf("drop publication: %w", err)
			}
		}
		if others == 0 {
			if _, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS walcount CASCADE"); err != nil {
				return fmt.Errorf("drop schema walcount: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if rdb != nil {
		if err := buffer.New(rdb, slot).Drop(ctx); err != nil {
			return err
		}
	}
	return nil
}
