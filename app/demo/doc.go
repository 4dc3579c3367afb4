// Package demo is `walcount demo`: the whole job, end to end, on one
// machine with nothing configured.
//
// Run takes the PostgreSQL (wal_level=logical) and Redis it is given
// (make demo starts throwaway ones with cmd/demo), creates the demo schema (schema walcount_demo: posts,
// likes with REPLICA IDENTITY FULL), runs walcount setup and starts the
// daemon in the same process. Several clients then like and unlike posts:
// post ids follow a Zipf distribution, and one viral post takes a fixed
// share of all traffic on top, so a few rows are very hot, the case that
// makes counter caches hard.
//
// Once a second a view shows what the app does (likes/s) and what walcount
// does (transactions/s, flushes, apply lag p50 and p99 from every
// observation of walcount_apply_lag_seconds, slot lag), and the hottest posts
// with their likes_count next to COUNT(*): the gap between them is the
// deltas still in flight, never drift. On a terminal the view redraws in
// place; otherwise it is one plain line per second.
//
// When the duration is over (or the context is cancelled) the load stops
// and Run settles: it emits a logical decoding message (a marker) and
// waits until walcount's checkpoint passes it, which means every
// transaction committed before the marker is in the counter columns
// (design rule 1). Then it compares every post with COUNT(*) and
// reports the mismatches, if any.
//
// Against servers the caller names, the demo keeps to its own names (schema,
// slot and publication walcount_demo) and drops them afterwards, so that it
// never touches an application's posts and likes or leaves a slot behind
// that would pin WAL.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
package demo
