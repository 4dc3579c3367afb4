-- walcount state schema version 5, exactly as walcount setup made it at
-- commit 5096a1c (2026-12-04), the last commit of that version's migrations: the
-- files state/migrations/0001..0005 of that commit, in the transaction
-- state.MigrateIn runs. Generated from git history (git show
-- 5096a1c:state/migrations/...); kept so that TestUpgradeFromEveryStateSchema
-- starts from each version a walcount has shipped. Do not edit.

CREATE SCHEMA walcount;
CREATE TABLE IF NOT EXISTS walcount.schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- Every walcount role reads the version before anything else, whatever
-- privileges it was granted on the other tables.
GRANT SELECT ON walcount.schema_version TO PUBLIC;

-- 0001_initial.sql at 5096a1c
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

-- 0002_ownership_dirty_leases.sql at 5096a1c
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

-- 0003_messages.sql at 5096a1c
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

-- 0004_carried.sql at 5096a1c
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

-- 0005_carried_drain_order.sql at 5096a1c
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
