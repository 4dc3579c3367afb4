-- Example app tables for docker compose: a Rails-style counter cache.
-- Point walcount at your own database instead by changing
-- WALCOUNT_DATABASE_URL and dropping this file from docker-compose.yml.
CREATE TABLE IF NOT EXISTS posts (
    id          bigint PRIMARY KEY,
    likes_count bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS likes (
    id      bigserial PRIMARY KEY,
    post_id bigint NOT NULL,
    user_id bigint NOT NULL DEFAULT 0
);
-- Reconciliation counts the likes of each post: an index on the key keeps
-- that from reading the whole table for every post (walcount check warns
-- without it).
CREATE INDEX IF NOT EXISTS likes_post_id_idx ON likes (post_id);
-- A DELETE must carry post_id for walcount to know which post lost a like.
ALTER TABLE likes REPLICA IDENTITY FULL;
INSERT INTO posts (id) SELECT g FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING;
