-- walcount setup --print-sql: what the owner of the tables runs once for walcount's role <walcount_role>
-- (slot "<slot>", publication "walcount", database <database>). Run it as the tables' owner:
--     psql -v ON_ERROR_STOP=1 -f this-file.sql
-- then run walcount setup as <walcount_role>: it creates the slot and leaves what exists and matches alone.
-- Each group says what it needs; a group that has nothing to do says so.

-- 1. walcount's state schema (version 6), created as and owned by <walcount_role>, so that its
--    later migrations need no new GRANT. walcount setup does this itself when run as <walcount_role>;
--    it is here because the publication below includes walcount.messages.
--    Needs: membership in role <walcount_role> (for SET ROLE), and CREATE on database <database> for <walcount_role>.
SET ROLE "<walcount_role>";
BEGIN;
CREATE SCHEMA IF NOT EXISTS walcount;
CREATE TABLE IF NOT EXISTS walcount.schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
GRANT SELECT ON walcount.schema_version TO PUBLIC;
-- Version 1: the state walcount kept before the schema had a version. Every
-- statement tolerates what a walcount of that time created (setup made the
-- checkpoint table; the daemon made the reconcile tables on first start), so
-- the same migration upgrades such a schema and creates a new one.

-- The checkpoint W of each slot: the end LSN of the last source transaction
-- whose deltas are in the counter columns.
CREATE TABLE IF NOT EXISTS walcount.checkpoint (
    slot_name  text PRIMARY KEY,
    lsn        pg_lsn NOT NULL,
    updated_at timestamptz NOT NULL
);

-- Reconciliation runs and their progress, so that a run resumes after a
-- restart.
CREATE TABLE IF NOT EXISTS walcount.reconcile_runs (
    id           bigserial PRIMARY KEY,
    slot_name    text NOT NULL,
    kind         text NOT NULL,
    counters     text[] NOT NULL,
    dry_run      boolean NOT NULL,
    batch_size   integer NOT NULL,
    status       text NOT NULL,
    cur_counter  text,
    last_key     text,
    total        bigint NOT NULL DEFAULT 0,
    keys_checked bigint NOT NULL DEFAULT 0,
    drifted      bigint NOT NULL DEFAULT 0,
    corrected    bigint NOT NULL DEFAULT 0,
    error        text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

-- The counters each slot keeps, as they were defined when last backfilled:
-- a new or changed definition is backfilled at the next start.
CREATE TABLE IF NOT EXISTS walcount.counters (
    slot_name     text NOT NULL,
    name          text NOT NULL,
    definition    text NOT NULL,
    backfilled_at timestamptz,
    PRIMARY KEY (slot_name, name)
);
INSERT INTO walcount.schema_version (version) VALUES (1);
-- Version 2: who owns each counter column, what walcount cannot vouch for,
-- and which daemon executes a reconciliation run.

-- One slot keeps each target column (design rule 15): a second deployment
-- claiming the same column would count every change twice.
CREATE TABLE walcount.owners (
    target_table  text NOT NULL,
    target_column text NOT NULL,
    slot_name     text NOT NULL,
    counter       text NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target_table, target_column)
);

-- Counters, or single keys of them, whose history walcount could not see
-- whole (design rule 14): each is reconciled exactly, then cleared. A NULL
-- key marks the whole counter.
CREATE TABLE walcount.dirty (
    id        bigserial PRIMARY KEY,
    slot_name text NOT NULL,
    counter   text NOT NULL,
    key       text,
    cause     text NOT NULL,
    since     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dirty_slot_counter ON walcount.dirty (slot_name, counter);

-- A run is executed by the daemon that holds its lease; a lease that
-- expired (its daemon died) may be taken over. A run may measure chosen
-- keys only (a dirty mark's), and clears the dirty marks it was made for
-- once it is done.
ALTER TABLE walcount.reconcile_runs
    ADD COLUMN owner       text,
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN keys        text[],
    ADD COLUMN dirty_ids   bigint[];

-- The publication each slot reads, so that teardown drops a publication
-- only when no other slot uses it.
ALTER TABLE walcount.checkpoint ADD COLUMN publication text;

-- The leaf partitions of each partitioned source as walcount last saw them
-- (design rule 14): DETACH, DROP and TRUNCATE of one partition, and ATTACH
-- of a table with rows, change a source's rows without row-level changes
-- in the WAL. A leaf gone, rewritten (a new relfilenode), attached again
-- (new pg_inherits rows: attached holds their xmins) or attached with rows
-- since marks its counter dirty.
CREATE TABLE walcount.partitions (
    slot_name   text NOT NULL,
    counter     text NOT NULL,
    leaf        oid  NOT NULL,
    name        text NOT NULL,
    relfilenode oid  NOT NULL,
    attached    text NOT NULL,
    PRIMARY KEY (slot_name, counter, leaf)
);
INSERT INTO walcount.schema_version (version) VALUES (2);
-- Version 3: the messages walcount acts on travel as rows of a table only
-- its own role may write (design rule 18). pg_logical_emit_message is
-- executable by PUBLIC, even in a READ ONLY transaction, so a message of
-- that kind proves nothing about its sender; a row of this table proves
-- its sender could write walcount's state. Each message is inserted and
-- deleted in the transaction that sends it: the table stays empty, and
-- the insert still reaches the stream with the rest of that transaction.
-- The table is in every walcount publication.
CREATE TABLE walcount.messages (
    id   bigint PRIMARY KEY,
    body text   NOT NULL
);
REVOKE ALL ON walcount.messages FROM PUBLIC;
INSERT INTO walcount.schema_version (version) VALUES (3);
-- Version 4: the deltas a flush could not apply now (design rule 2).
--
-- A flush applies the keys whose target rows it can lock at once and
-- carries the others to the next flush: a row the application holds
-- locked (deferred, parked_error NULL), or a key whose UPDATE failed on
-- the row's data (parked: a trigger that raises, a CHECK constraint),
-- retried from retry_at on. Its rows are written in the flush's
-- transaction, with the checkpoint's compare-and-set, so that a carried
-- delta is part of walcount's state exactly as the counter columns are:
-- the counter columns plus these rows hold every delta of the
-- transactions up to W. Reconciliation reads them in its snapshot. since
-- is when the key was first carried.
CREATE TABLE walcount.carried (
    slot_name    text NOT NULL,
    counter      text NOT NULL,
    key          text NOT NULL,
    delta        bigint NOT NULL,
    since        timestamptz NOT NULL DEFAULT now(),
    parked_error text,
    retry_at     timestamptz,
    PRIMARY KEY (slot_name, counter, key)
);
INSERT INTO walcount.schema_version (version) VALUES (4);
-- Version 5: the order in which a big batch's carried keys are applied
-- (design rule 2, "Big batches go in pieces").
--
-- A batch of more keys than one flush transaction may update is staged in
-- walcount.carried and applied in pieces, each the next keys in this
-- index's order. For integer keys (the usual target key) (length, text)
-- is numeric order, so a piece updates neighbouring target rows, a few heap
-- pages, instead of keys spread over the whole table as the primary key's
-- text order ('1', '10', '100', ...) would pick them. Any other key type is
-- still totally ordered by it.
CREATE INDEX carried_drain_order ON walcount.carried (slot_name, counter, length(key), key);
INSERT INTO walcount.schema_version (version) VALUES (5);
-- Version 6: what walcount setup needs to remember to never adopt a stale
-- slot, and to undo at teardown what it changed on the app's tables.
--
-- publication_oid and publication_lsn: the publication the slot reads, as
-- setup last saw it, and a WAL position at which it already existed.
-- pgoutput looks the publication up in the catalog as of the position it
-- decodes: a slot whose confirmed position is before publication_lsn (or a
-- publication with another oid, made again since) may decode changes made
-- before the publication existed, and PostgreSQL before 18 then fails the
-- stream for good with "publication ... does not exist".
ALTER TABLE walcount.checkpoint
    ADD COLUMN publication_oid oid,
    ADD COLUMN publication_lsn pg_lsn;

-- The replica identity each table had before walcount setup set it to
-- FULL, so that walcount teardown can restore it: relident is
-- pg_class.relreplident ('d' default, 'n' nothing, 'i' index, 'f' full)
-- and index_name the index of 'i'. The first record of a table wins: a
-- later setup sees FULL, which is walcount's own.
CREATE TABLE walcount.replica_identity (
    relation    text PRIMARY KEY,
    relident    text NOT NULL,
    index_name  text,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- A slot an older walcount streamed from gets its mark from the migration:
-- its checkpoint vouches that it read this publication (the stream would
-- have failed at every start otherwise), so the publication of today's oid
-- counts as there from the start ('0/0'). A publication made again later
-- has another oid and is tested afresh. Without this, the catalog test of
-- an upgraded slot could find the publication newer than the slot's
-- catalog_xmin (a transaction open when the slot was made) and refuse a
-- slot that works.
UPDATE walcount.checkpoint c
SET publication_oid = p.oid, publication_lsn = '0/0'
FROM pg_publication p
WHERE p.pubname = coalesce(c.publication, 'walcount') AND c.publication_oid IS NULL;
INSERT INTO walcount.schema_version (version) VALUES (6);
COMMIT;
RESET ROLE;

-- 2. Privileges walcount's role needs on the tables: reading the sources (backfill and
--    reconciliation) and updating the counter columns (the flush).
--    Needs: ownership of the tables (or the GRANT OPTION).
GRANT SELECT ON "public"."likes" TO "<walcount_role>";
GRANT SELECT ON "public"."posts" TO "<walcount_role>";
GRANT SELECT ("id", "likes_count", "comments_count", "score", "last_comment_at"), UPDATE ("likes_count", "comments_count", "score", "last_comment_at") ON "public"."posts" TO "<walcount_role>";
GRANT SELECT ON "public"."comments" TO "<walcount_role>";
GRANT SELECT ON "public"."votes" TO "<walcount_role>";
GRANT SELECT ("id", "karma"), UPDATE ("karma") ON "public"."users" TO "<walcount_role>";
GRANT SELECT ON "public"."post_tags" TO "<walcount_role>";
GRANT SELECT ("id", "posts_count"), UPDATE ("posts_count"), INSERT ("id", "posts_count", "name") ON "public"."tags" TO "<walcount_role>";

-- 3. Replica identity FULL, so that updates and deletes carry the columns the counters read;
--    the identity each table had is recorded first (as <walcount_role>), for walcount teardown to restore.
--    Needs: ownership of each table, and membership in role <walcount_role>.
SET ROLE "<walcount_role>";
INSERT INTO walcount.replica_identity (relation, relident, index_name) VALUES ('"public"."comments"', 'd', nullif('', '')) ON CONFLICT (relation) DO NOTHING;
RESET ROLE;
ALTER TABLE "public"."comments" REPLICA IDENTITY FULL;
SET ROLE "<walcount_role>";
INSERT INTO walcount.replica_identity (relation, relident, index_name) VALUES ('"public"."likes"', 'd', nullif('', '')) ON CONFLICT (relation) DO NOTHING;
RESET ROLE;
ALTER TABLE "public"."likes" REPLICA IDENTITY FULL;
SET ROLE "<walcount_role>";
INSERT INTO walcount.replica_identity (relation, relident, index_name) VALUES ('"public"."posts"', 'd', nullif('', '')) ON CONFLICT (relation) DO NOTHING;
RESET ROLE;
ALTER TABLE "public"."posts" REPLICA IDENTITY FULL;
SET ROLE "<walcount_role>";
INSERT INTO walcount.replica_identity (relation, relident, index_name) VALUES ('"public"."votes"', 'd', nullif('', '')) ON CONFLICT (relation) DO NOTHING;
RESET ROLE;
ALTER TABLE "public"."votes" REPLICA IDENTITY FULL;

-- walcount's via tables ("walcount"."via_user_karma") of the counters through a parent, created as and
--    owned by <walcount_role>, each with a row of zeros for every parent row. walcount setup does this itself
--    when run as <walcount_role>; it is here because the publication below includes them.
--    Needs: membership in role <walcount_role>, and the SELECT on the parents granted above.
SET ROLE "<walcount_role>";
CREATE TABLE IF NOT EXISTS "walcount"."via_user_karma" (parent_key bigint PRIMARY KEY, target bigint NOT NULL DEFAULT 0, passes bigint NOT NULL DEFAULT 0, total bigint NOT NULL DEFAULT 0);
ALTER TABLE "walcount"."via_user_karma" REPLICA IDENTITY FULL;
CREATE INDEX IF NOT EXISTS "via_user_karma_target" ON "walcount"."via_user_karma" (target);
INSERT INTO "walcount"."via_user_karma" (parent_key) SELECT p."id" FROM "public"."posts" AS p WHERE p."id" IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "walcount"."via_user_karma" AS v WHERE v.parent_key = p."id") ON CONFLICT DO NOTHING;
RESET ROLE;

-- 4. The publication of the sources, the targets and walcount.messages.
--    Needs: CREATE on database <database>, ownership of "public"."comments", "public"."likes", "public"."post_tags", "public"."posts", "public"."tags", "public"."users", "public"."votes", "walcount"."via_user_karma", and of walcount.messages
--    (owned by <walcount_role>: membership in that role counts).
CREATE PUBLICATION "walcount" FOR TABLE "public"."comments", "public"."likes", "public"."post_tags", "public"."posts", "public"."tags" ("id", "posts_count"), "public"."users" ("id", "karma"), "public"."votes", "walcount"."via_user_karma", "walcount"."messages";
--    Handed over to <walcount_role>, so that walcount teardown can drop it.
--    Needs: membership in role <walcount_role>, and CREATE on database <database> for <walcount_role>.
ALTER PUBLICATION "walcount" OWNER TO "<walcount_role>";

-- 5. The replication slot and its checkpoint: walcount setup creates them as <walcount_role>, once the
--    publication exists (needs REPLICATION, or superuser). For reference only, not run here:
--     SELECT lsn::text FROM pg_create_logical_replication_slot('<slot>', 'pgoutput', false, false, true);
--     INSERT INTO walcount.checkpoint (slot_name, lsn, updated_at)
--     SELECT '<slot>', confirmed_flush_lsn, now() FROM pg_replication_slots WHERE slot_name = '<slot>'
--     ON CONFLICT (slot_name) DO UPDATE SET lsn = excluded.lsn, updated_at = now();
