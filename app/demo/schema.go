package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// Names the demo creates. They are its own, so that a demo against an
// existing database never touches the application's tables or walcount's
// production slot.
const (
	// Schema holds the demo's posts and likes.
	Schema = "walcount_demo"
	// Slot is the demo's logical replication slot.
	Slot = "walcount_demo"
	// Publication is the demo's publication.
	Publication = "walcount_demo"
	// CounterName is the demo counter's name in metrics and Redis fields.
	CounterName = "post_likes"
)

// Counter is the demo's counter: the likes of each post in
// walcount_demo.posts.likes_count, the default counter in the demo schema.
func Counter() counter.Counter {
	return counter.Counter{
		Name:      CounterName,
		Source:    Schema + ".likes",
		Key:       "post_id",
		Target:    Schema + ".posts",
		TargetKey: "id",
		Column:    "likes_count",
	}
}

// createSchema drops any earlier demo schema and creates posts 1..posts
// and an empty likes table. likes has REPLICA IDENTITY FULL so that a
// DELETE carries post_id (design rule 11), and an index on post_id, as
// an app that counts and deletes likes by post would have.
func createSchema(ctx context.Context, db *pgxpool.Pool, posts int) error {
	ddl := fmt.Sprintf(`
DROP SCHEMA IF EXISTS %[1]s CASCADE;
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL);
CREATE INDEX likes_post_id_idx ON %[1]s.likes (post_id);
ALTER TABLE %[1]s.likes REPLICA IDENTITY FULL;
`, pgx.Identifier{Schema}.Sanitize())
	if _, err := db.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create demo schema: %w", err)
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.posts (id) SELECT g FROM generate_series(1, $1::bigint) g`,
		pgx.Identifier{Schema}.Sanitize()), posts); err != nil {
		return fmt.Errorf("create demo posts: %w", err)
	}
	return nil
}

// dropAll removes everything the demo created on servers it does not own:
// the slot (an abandoned slot pins WAL forever), the publication, the demo
// schema, the demo's checkpoint row and its Redis keys. walcount's own
// schema stays, since a real installation may share it. The daemon must
// have stopped: a slot in use cannot be dropped.
func dropAll(ctx context.Context, db *pgxpool.Pool, rdb redis.UniversalClient) error {
	stmts := []struct {
		sql  string
		args []any
	}{
		{slot.DropIfExistsSQL, []any{Slot}},
		{"DROP PUBLICATION IF EXISTS " + pgx.Identifier{Publication}.Sanitize(), nil},
		{"DROP SCHEMA IF EXISTS " + pgx.Identifier{Schema}.Sanitize() + " CASCADE", nil},
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("clean up demo: %w", err)
		}
	}
	if have, err := state.HasCheckpoint(ctx, db, Slot); err != nil {
		return fmt.Errorf("clean up demo: %w", err)
	} else if have {
		if err := state.DeleteCheckpoint(ctx, db, Slot); err != nil {
			return fmt.Errorf("clean up demo: %w", err)
		}
	}
	if err := buffer.New(rdb, Slot).Drop(ctx); err != nil {
		return fmt.Errorf("clean up demo: %w", err)
	}
	return nil
}
