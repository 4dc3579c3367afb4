// Package reconcile compares counter columns with the truth (COUNT(*) or
// SUM() over the source rows) while writes go on, and corrects only what
// is really wrong (DESIGN §5).
//
// A naive reconcile, SET likes_count = COUNT(*), races with the deltas
// still on their way and itself creates drift on hot keys. Here each
// measurement of a batch of keys is bracketed by two logical messages
// (pg_logical_emit_message) that travel through the replication stream:
//
//  1. M0 is emitted. From its commit on, the Recorder, which runs inside
//     the aggregator's goroutine, records for every transaction its xid,
//     end LSN and its deltas for the batch's keys only.
//  2. The checkpoint W is flushed past M0's commit, so every transaction
//     that is not recorded is in the counter columns.
//  3. One REPEATABLE READ transaction reads its snapshot S
//     (pg_current_snapshot()), W as S sees it (W_S), the true value of
//     each key and the column.
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
// A correction is applied only when a second, independent measurement of
// the same key finds the same value. It enters the stream as an ordinary
// delta of M1's transaction and is flushed exactly once with everything
// else: if the daemon crashes before that flush and the stream is
// replayed, the marker no longer belongs to a live measurement and the
// correction is not repeated (it is lost, never doubled; the next run
// finds the drift again).
//
// Snapshots: https://www.postgresql.org/docs/15/functions-info.html#FUNCTIONS-PG-SNAPSHOT.
// Logical messages: https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-REPLICATION.
package reconcile
