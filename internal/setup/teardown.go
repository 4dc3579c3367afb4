package setup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
)

// TeardownPlan lists what Teardown drops.
func TeardownPlan(slot, publication string) []string {
	return []string{
		fmt.Sprintf("replication slot %q (SELECT pg_drop_replication_slot('%s'))", slot, slot),
		fmt.Sprintf("publication %q (DROP PUBLICATION %s)", publication, pgx.Identifier{publication}.Sanitize()),
		"schema walcount and its tables (DROP SCHEMA walcount CASCADE)",
		fmt.Sprintf("redis keys %v", buffer.KeysFor(slot).All()),
	}
}

// Teardown drops the slot, so no abandoned slot pins WAL, the
// publication, walcount's state schema and its Redis keys. It is
// idempotent. A slot in use by a running walcount cannot be dropped: stop
// the daemon first.
func Teardown(ctx context.Context, conn *pgx.Conn, rdb redis.UniversalClient, slot, publication string) error {
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("drop replication slot %q (is walcount run still running?): %w", slot, err)
	}
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{publication}.Sanitize()); err != nil {
		return fmt.Errorf("drop publication: %w", err)
	}
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS walcount CASCADE"); err != nil {
		return fmt.Errorf("drop schema walcount: %w", err)
	}
	if rdb != nil {
		if err := buffer.New(rdb, slot).Drop(ctx); err != nil {
			return err
		}
	}
	return nil
}
