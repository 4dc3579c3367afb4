-- Version 2: who owns each counter column, what walcount cannot vouch for,
-- and which daemon executes a reconciliation run.

-- One slot keeps each target column (DESIGN rule 15): a second deployment
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
-- whole (DESIGN rule 14): each is reconciled exactly, then cleared. A NULL
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
