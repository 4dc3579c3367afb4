// Package reconcile compares counter columns with the truth (COUNT(*) or
// SUM() over the source rows) while writes go on, and corrects only what
// is really wrong (docs/design.md §5).
//
// A naive reconcile, SET likes_count = COUNT(*), races with the deltas
// still on their way and itself creates drift on hot keys. Here each
// measurement is bracketed by two logical messages
// (pg_logical_emit_message) that travel through the replication stream:
//
//  1. M0 is emitted. From its commit on, the Recorder, which runs inside
//     the aggregator's goroutine, records for every transaction its xid,
//     end LSN and its deltas for the measured counter, whatever the key.
//  2. The checkpoint W is flushed past M0's commit, so every transaction
//     that is not recorded is in the counter columns.
//  3. One REPEATABLE READ transaction reads its snapshot S
//     (pg_current_snapshot()), W as S sees it (W_S), and the true value
//     and the column of the keys measured.
//  4. M1 is emitted. Every transaction visible in S committed before M1,
//     so it is in the stream before M1.
//  5. At M1, pending(k) is the sum of the recorded deltas of transactions
//     that end after W_S (not yet in the column as S sees it) and whose
//     xid S sees as committed (already in the truth). Then
//     correction(k) = truth(k) − column(k) − pending(k).
//
// The column in S holds exactly the transactions up to W_S, because a
// flush commits the counter updates and W in one transaction; so without
// drift the correction is zero, whatever the write load.
//
// Because the recording covers every key of the counter, one snapshot
// serves any number of keys. A full run reads its keys in ranges (a
// survey): one query per range joins the target rows with an aggregate
// of the source rows of the range and returns only the keys whose column
// differs from their true value in S. Every other key of the range has
// correction −pending(k), known from the recording, so the survey is an
// exact measurement of the whole range at the cost of reading it once.
// A key with a non-zero correction is measured again, by key, in the
// next measurement, which also surveys the next range: a pass makes one
// stream round trip per range, and its cost is close to computing the
// truth of the table once.
//
// A correction is applied only when a second, independent measurement of
// the same key finds the same value. It enters the stream as an ordinary
// delta of a transactional message of its own, emitted after the second
// measurement, and is flushed exactly once with everything else: if the
// daemon crashes before that flush and the stream is replayed, the
// message is replayed with its transaction and applied once. It counts as
// applied once W has passed it.
//
// A pass can be paced (Pacer): at most MaxKeysPerSecond keys are read per
// second, and no measurement reads more than one second's worth.
//
// Snapshots: https://www.postgresql.org/docs/15/functions-info.html#FUNCTIONS-PG-SNAPSHOT.
// Logical messages: https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-REPLICATION.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package reconcile
