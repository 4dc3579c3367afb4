// Package state owns walcount's durable state in PostgreSQL: the schema
// "walcount", its version, and every statement on its tables.
//
// PostgreSQL is the only durable anchor of walcount's exactly-once
// protocol. The table walcount.checkpoint holds W for each slot: the end LSN
// of the last source transaction whose deltas are in the counter columns.
// A flush moves W with a compare-and-set in the same transaction that
// applies its deltas (CompareAndSet), so a second flusher, a retried flush
// or a replayed batch matches no row and applies nothing; walcount.carried,
// written in the same transaction, holds the deltas a flush carried to the
// next (LoadCarried, UpdateCarried). The other tables keep reconciliation
// runs and the counters already backfilled.
//
// The schema is created and migrated forward by `walcount setup`
// (Migrate), from SQL files embedded in the binary; a version row records
// how far. walcount run migrates an older schema too, while it holds the
// slot (app/daemon's upgrade.go), or says what the schema's owner must run
// (MigrationPrivilegeError). check and status only read it. Every command
// refuses a schema newer than it knows (NewerError). testdata/ keeps the
// DDL of every version a walcount has made.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package state
