// Package aggregator turns committed row changes into signed counter
// deltas and writes them to the Redis buffer in coalesced batches.
//
// Each counter rule maps a row to a contribution (key, amount); a change
// adds contribution(new) − contribution(old) (docs/design.md §3), so an UPDATE that
// moves a like to another post yields −1 for the old post and +1 for the
// new one, and a no-op UPDATE yields nothing.
//
// Deltas of a transaction are kept apart until its COMMIT arrives, then
// merged into the pending batch. The pending batch, which spans many
// transactions, goes to Redis in one Lua call that also moves meta.lsn
// from the previous batch's end to this batch's last end LSN (design
// rule 5). Transactions whose end LSN is at or below what Redis or
// PostgreSQL already hold are dropped whole (rule 4): after a reconnect
// the server resends from the confirmed position, and mixing a resent
// transaction into a new batch would count it twice.
//
// A TRUNCATE of a source table is a barrier (rule 10): the pending batch
// is written, the sink flushes and then zeroes the counters in the same
// transaction that moves W past the TRUNCATE.
//
// It talks to the rest of walcount through the ports of Options, one a
// party: Buffer (the Redis buffer, which may be a Spiller), Barrier (the
// sink, for a TRUNCATE), Commits (the apply lag's commit times),
// Reconciliation (reconcile's recorder: walcount's messages and every
// committed transaction), Flushes (what each flush applied) and Marks
// (the dirty and degraded marks); the session wires them (app/daemon).
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package aggregator
