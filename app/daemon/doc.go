// Package daemon wires cdc, aggregator and sink into walcount run: it
// owns the connections, runs one replication session at a time and
// restarts it after failures with capped exponential backoff.
//
// A session is the unit of recovery (docs/design.md §4). It reads W, takes the
// slot (START_REPLICATION fails while another walcount holds it, so a
// second instance waits here and takes over when the first stops), checks
// that Redis continues W and resets it when it does not (rule 7), resumes
// or discards an unfinished flush, and only then starts consuming. Any
// error ends the whole session: nothing past W was acknowledged, so the
// next session replays it and skips what Redis already holds (rule 4).
//
// Teardown order on SIGINT/SIGTERM: stop reading the stream; let the
// aggregator drain what was already received and write it to Redis; run a
// final flush bounded by ShutdownTimeout; then send the final status
// update confirming the new W and close the replication connection.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
package daemon
