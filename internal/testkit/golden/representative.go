package golden

import "github.com/walcount/walcount/internal/testkit/appschema"

// RepresentativeSchema and RepresentativeConfig are the app's tables and
// the walcount configuration that the golden files of walcount setup
// --print-sql and walcount check are made with: one counter of each kind (a
// plain count, a filtered count, a sum, a sum through a parent, a max, and
// a count that creates its missing target rows). The sources keep their
// default replica identity, so that the fixes show too.
var RepresentativeSchema = appschema.SQL(appschema.Options{
	PostsColumns: `author_id bigint,
    deleted boolean NOT NULL DEFAULT false,
    comments_count bigint NOT NULL DEFAULT 0,
    score bigint NOT NULL DEFAULT 0,
    last_comment_at timestamptz`,
	DefaultIdentity: true,
	Index:           true,
}) + `
CREATE TABLE users (id bigint PRIMARY KEY, karma bigint NOT NULL DEFAULT 0);
CREATE TABLE comments (
    id bigserial PRIMARY KEY,
    post_id bigint NOT NULL,
    deleted boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON comments (post_id, created_at) WHERE NOT deleted;
CREATE TABLE votes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, score integer NOT NULL);
CREATE INDEX ON votes (post_id);
CREATE TABLE tags (id bigint PRIMARY KEY, name text NOT NULL, posts_count bigint NOT NULL DEFAULT 0);
CREATE TABLE post_tags (post_id bigint NOT NULL, tag_id bigint NOT NULL, PRIMARY KEY (tag_id, post_id));
`

// RepresentativeConfig is the counters of RepresentativeSchema, as a
// configuration file holds them; the connections and the slot come from
// the test.
const RepresentativeConfig = `counters:
  - name: post_likes               # a plain count
    source: likes
    key: post_id
    target: posts
    target_key: id
    column: likes_count
  - name: post_comments            # a filtered count
    source: comments
    key: post_id
    where: {deleted: false}
    target: posts
    target_key: id
    column: comments_count
  - name: post_score               # a sum
    source: votes
    key: post_id
    target: posts
    target_key: id
    column: score
    sum: score
  - name: user_karma               # a sum through a parent
    source: votes
    key: post_id
    via: {table: posts, key: id, column: author_id, where: {deleted: false}}
    target: users
    target_key: id
    column: karma
    sum: score
  - name: post_last_comment        # a max
    source: comments
    key: post_id
    where: {deleted: false}
    target: posts
    target_key: id
    column: last_comment_at
    max: created_at
  - name: tag_posts                # a count that creates its missing target rows
    source: post_tags
    key: tag_id
    target: tags
    target_key: id
    column: posts_count
    create_missing:
      defaults: {name: ""}
`
