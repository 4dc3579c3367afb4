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
