-- walcount's state before the schema had a version (version 0), as walcount
-- made it at commit 17c9b3d (2026-11-30): setup created walcount.checkpoint
-- (sink/checkpoint.go's CheckpointDDL) and the daemon the reconcile tables
-- on its first start (reconcile/store.go). Generated from git history; kept
-- so that TestUpgradeFromEveryStateSchema starts from it. Do not edit.

CREATE SCHEMA walcount;
CREATE TABLE IF NOT EXISTS walcount.checkpoint (
    slot_name  text PRIMARY KEY,
    lsn        pg_lsn NOT NULL,
    updated_at timestamptz NOT NULL
);
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
CREATE TABLE IF NOT EXISTS walcount.counters (
    slot_name     text NOT NULL,
    name          text NOT NULL,
    definition    text NOT NULL,
    backfilled_at timestamptz,
    PRIMARY KEY (slot_name, name)
);
