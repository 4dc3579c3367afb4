// Package appschema is the app's tables the tests count: posts, whose
// likes_count is the default counter's column, and likes, its source.
//
// SQL returns them as one string of statements, for a test to run where
// it makes its database; a variant a test needs (another column, another
// table, a trigger) is an option or a small ALTER or CREATE after them.
// A test whose assertion is about the exact shape of a table (a missing
// key, an identity, a column's type) declares that table itself.
//
// It is part of the test kit (internal/testkit): for walcount's own tests,
// demo and bench; not a stable API.
package appschema

import (
	"fmt"
	"strings"
)

// Options shape the tables SQL creates. The zero Options give
//
//	CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
//	CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL);
//	ALTER TABLE likes REPLICA IDENTITY FULL;
type Options struct {
	// PostsColumns and LikesColumns are more column definitions (or
	// table constraints), comma separated, appended to the table's own:
	// "user_id bigint NOT NULL DEFAULT 0", say.
	PostsColumns, LikesColumns string
	// LikesLeadingColumns are column definitions that come before
	// likes.post_id (after id): a test that drops one moves the counted
	// columns' positions.
	LikesLeadingColumns string
	// KeyType is the type of posts.id and likes.post_id; bigint when
	// empty.
	KeyType string
	// DefaultIdentity leaves likes with the replica identity DEFAULT
	// (its primary key) instead of FULL.
	DefaultIdentity bool
	// Index creates the index on likes (post_id).
	Index bool
	// PartitionBy, when set, makes likes a partitioned table,
	// "PARTITION BY " + PartitionBy, without a primary key (one must
	// contain the partition key: the test adds it if it wants one) and
	// without partitions (the test creates them, and sets their
	// identity: a partition does not take its parent's).
	PartitionBy string
	// Posts is how many posts SQL inserts, with the ids 1 to Posts.
	Posts int
}

// SQL returns the statements that create the tables.
func SQL(o Options) string {
	key := o.KeyType
	if key == "" {
		key = "bigint"
	}
	more := func(cols string) string {
		if cols == "" {
			return ""
		}
		return ", " + cols
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE posts (id %s PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0%s);\n", key, more(o.PostsColumns))
	lead := more(o.LikesLeadingColumns)
	if o.PartitionBy == "" {
		fmt.Fprintf(&b, "CREATE TABLE likes (id bigserial PRIMARY KEY%s, post_id %s NOT NULL%s);\n", lead, key, more(o.LikesColumns))
	} else {
		fmt.Fprintf(&b, "CREATE TABLE likes (id bigserial NOT NULL%s, post_id %s NOT NULL%s) PARTITION BY %s;\n", lead, key, more(o.LikesColumns), o.PartitionBy)
	}
	if !o.DefaultIdentity {
		b.WriteString("ALTER TABLE likes REPLICA IDENTITY FULL;\n")
	}
	if o.Index {
		b.WriteString("CREATE INDEX ON likes (post_id);\n")
	}
	if o.Posts > 0 {
		fmt.Fprintf(&b, "INSERT INTO posts (id) SELECT g FROM generate_series(1, %d) g;\n", o.Posts)
	}
	return b.String()
}
