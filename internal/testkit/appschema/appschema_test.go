package appschema

import "testing"

func TestSQL(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"zero", Options{}, `CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL);
ALTER TABLE likes REPLICA IDENTITY FULL;
`},
		{"every option", Options{PostsColumns: "title text", LikesColumns: "user_id bigint, w int", KeyType: "text",
			DefaultIdentity: true, Index: true, Posts: 3}, `CREATE TABLE posts (id text PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0, title text);
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id text NOT NULL, user_id bigint, w int);
CREATE INDEX ON likes (post_id);
INSERT INTO posts (id) SELECT g FROM generate_series(1, 3) g;
`},
		{"partitioned", Options{PartitionBy: "RANGE (post_id)"}, `CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE likes (id bigserial NOT NULL, post_id bigint NOT NULL) PARTITION BY RANGE (post_id);
ALTER TABLE likes REPLICA IDENTITY FULL;
`},
	} {
		if got := SQL(tc.o); got != tc.want {
			t.Errorf("%s: SQL =\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}
