// Package preflight is the engine of `walcount check`: it inspects the
// PostgreSQL server, the source and target tables, the publication, the
// replication slot, walcount's checkpoint table and Redis, and reports each
// thing that would make walcount fail or count wrongly, with the exact SQL
// or setting that fixes it (design rule 11; docs/design.md §6).
//
// The checks read only catalogs and settings; the only writes are a
// short-lived Redis key to prove that Redis accepts writes. They rely on:
//
//   - logical decoding needing wal_level = logical and a free slot and WAL
//     sender (https://www.postgresql.org/docs/current/logicaldecoding.html,
//     https://www.postgresql.org/docs/current/runtime-config-replication.html);
//   - the replica identity deciding which old column values an UPDATE or
//     DELETE carries in the WAL
//     (https://www.postgresql.org/docs/current/sql-altertable.html#SQL-ALTERTABLE-REPLICA-IDENTITY):
//     a change that does not carry the key, filter and summed columns of a
//     counter cannot be turned into a delta, so walcount must refuse rather
//     than guess;
//   - a publication choosing the tables, operations, columns and rows that
//     pgoutput sends (https://www.postgresql.org/docs/current/logical-replication-publication.html);
//   - pg_replication_slots.wal_status telling whether the slot still has
//     its WAL (https://www.postgresql.org/docs/current/view-pg-replication-slots.html).
//
// A failure to connect to PostgreSQL is Run's error, since nothing else can
// be checked; everything else, Redis being down included, is a Finding.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
package preflight
