// Package cdc follows walcount's logical replication slot.
//
// One goroutine, Stream.Run, owns the replication connection
// (https://www.postgresql.org/docs/15/protocol-replication.html): it
// decodes the pgoutput protocol
// (https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html),
// hands committed work downstream as batches of events through a bounded
// channel, answers keepalives and sends standby status updates. Nothing
// else ever writes to that connection; the sink reports the position that
// is safe to acknowledge through Stream.Ack, which only stores it.
//
// The acknowledged (flush) position is always W, the end LSN of the last
// transaction whose deltas are committed in the counter columns (design
// rule 3). It is never the received position: everything past W must stay
// in the slot until it is durable in PostgreSQL, because Redis may lose it.
//
// Decoding writes column values into a per-batch arena, so the hot path
// allocates per batch, not per row or column.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package cdc
