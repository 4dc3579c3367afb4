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
// Counter updates use one statement per chunk of keys, keys sorted so two
// transactions never lock the same rows in opposite orders:
//
//	UPDATE posts AS t SET likes_count = t.likes_count + d.delta
//	FROM (SELECT k::bigint AS id, delta FROM unnest($1::text[], $2::bigint[]) AS u(k, delta)) d
//	WHERE t.id = d.id
//
// See https://www.postgresql.org/docs/15/sql-update.html.
package sink
