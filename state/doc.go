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
// how far. The daemon, check and status only read it, and refuse a schema
// of another version with the command that fixes it (CheckVersion).
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package state
