// Package sink applies buffered deltas to the counter columns, exactly
// once, and decides W, the position cdc may acknowledge.
//
// Every flush interval the Flusher hands the Redis buffer over (RENAME to
// "flushing", see package buffer) and applies it in ONE PostgreSQL
// transaction that also moves the checkpoint with a compare-and-set:
//
//	UPDATE walcount.checkpoint SET lsn = U WHERE slot_name = $1 AND lsn = W
//
// The compare-and-set runs first, so it takes the checkpoint row's lock
// before any counter row: a second flusher, a retried flush or a replayed
// batch waits on it, then matches no row and rolls back without applying
// anything (design rules 1–2). Only after the commit is "flushing"
// deleted and U handed to cdc as the new acknowledgement (rule 3). A crash
// between any two of these steps is repaired by the next flush: a
// "flushing" that starts at W is applied again (it was not committed), one
// that ends at or below W is deleted (it was).
//
// A batch of more keys than one transaction may update is staged in
// walcount.carried by the transaction that moves W and then applied in
// short pieces, each a transaction of its own (see Flusher.Flush and
// docs/design.md, rule 2, "Big batches go in pieces").
//
// Counter updates use one statement per chunk of keys, keys sorted. A
// flush never waits for a row lock: each statement locks the chunk's
// target rows it can lock at once (FOR NO KEY UPDATE SKIP LOCKED) and
// updates only those; the deltas of rows another transaction holds are
// carried to the next flush in walcount.carried, written in the same
// transaction as the compare-and-set, and so is a key whose update fails on
// its row's data (parked, retried later). See docs/design.md, rule 2.
//
// The flusher's parts: flusher.go, its lifecycle, Run and Request, and
// the flush that ends in one transaction; plan.go, the grouping of a batch
// by counter and key, the lifecycle moves run on the carried keys, and
// their merge with the batch; apply.go, the transaction that moves W and
// applies the batch; chunk.go, one statement on a chunk of keys, with its
// savepoint, its bisection on a row's data error and the retry that
// isolates it; carry.go, what is carried and parked, written in the flush
// transaction, and the metrics once it committed; pieces.go, the stage
// and drain of a big batch; pace.go, the pacing of the statements;
// events.go, the change events each transaction owes (package events);
// and barrier.go, the TRUNCATE barrier.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package sink
