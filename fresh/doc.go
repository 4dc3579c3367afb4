// Package fresh answers fresh reads: a counter's value now, the column
// plus every delta not yet in it, exact at one LSN, and waits for an LSN
// for read-your-writes (docs/design.md §7, docs/fresh-reads.md). It reads
// PostgreSQL and Redis only, never the session's memory, so the active
// daemon and a standby answer alike, and it never takes a lock or a
// connection the stream or the flush needs.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package fresh
