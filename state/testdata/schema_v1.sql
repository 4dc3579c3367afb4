-- walcount state schema version 1, exactly as walcount setup made it at
-- commit 80b3eea (2026-11-30), the last commit of that version's migrations: the
-- files state/migrations/0001..0001 of that commit, in the transaction
-- state.MigrateIn runs. Generated from git history (git show
-- 80b3eea:state/migrations/...); kept so that TestUpgradeFromEveryStateSchema
-- starts from each version a walcount has shipped. Do not edit.

CREATE SCHEMA walcount;
CREATE TABLE IF NOT EXISTS walcount.schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- Every walcount role reads the version before anything else, whatever
-- privileges it was granted on the other tables.
GRANT SELECT ON walcount.schema_version TO PUBLIC;

-- 0001_initial.sql at 80b3eea
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
