package appschema

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestSQL runs what SQL returns on a database of its own for each set of
// options, and reads back from the catalog what the tests rely on: the
// columns in order with their types, likes' replica identity, its index
// and partitioning, and the posts inserted.
func TestSQL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                       string
		o                          Options
		posts, likes, ident, index string
		partitioned                bool
		rows                       int
	}{
		{name: "zero", o: Options{},
			posts: "id bigint, likes_count bigint", likes: "id bigint, post_id bigint", ident: "f"},
		{name: "every option", o: Options{PostsColumns: "title text", LikesLeadingColumns: "junk text", LikesColumns: "user_id bigint, w int",
			KeyType: "text", DefaultIdentity: true, Index: true, Posts: 3},
			posts: "id text, likes_count bigint, title text", likes: "id bigint, junk text, post_id text, user_id bigint, w integer",
			ident: "d", index: "likes_post_id_idx", rows: 3},
		{name: "partitioned", o: Options{PartitionBy: "RANGE (post_id)"},
			posts: "id bigint, likes_count bigint", likes: "id bigint, post_id bigint", ident: "f", partitioned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := pgx.Connect(ctx, testenv.Database(t))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, SQL(tc.o)); err != nil {
				t.Fatalf("SQL(%+v): %v\n%s", tc.o, err, SQL(tc.o))
			}
			columns := func(table string) string {
				var cols []string
				rows, err := conn.Query(ctx, `SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table)
				if err != nil {
					t.Fatal(err)
				}
				if cols, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
					t.Fatal(err)
				}
				return strings.Join(cols, ", ")
			}
			if got := columns("posts"); got != tc.posts {
				t.Errorf("posts: %s, want %s", got, tc.posts)
			}
			if got := columns("likes"); got != tc.likes {
				t.Errorf("likes: %s, want %s", got, tc.likes)
			}
			var ident, kind, index string
			var rows int
			if err := conn.QueryRow(ctx, `SELECT relreplident::text, relkind::text,
  coalesce((SELECT string_agg(i.indexrelid::regclass::text, ',') FROM pg_index i WHERE i.indrelid = c.oid AND NOT i.indisprimary), ''),
  (SELECT count(*) FROM posts)::int
FROM pg_class c WHERE c.oid = 'likes'::regclass`).Scan(&ident, &kind, &index, &rows); err != nil {
				t.Fatal(err)
			}
			if ident != tc.ident || index != tc.index || (kind == "p") != tc.partitioned || rows != tc.rows {
				t.Errorf("likes: identity %s, index %q, kind %s, %d posts; want identity %s, index %q, partitioned %v, %d posts",
					ident, index, kind, rows, tc.ident, tc.index, tc.partitioned, tc.rows)
			}
		})
	}
}
