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
