// Package buffer is walcount's Redis protocol: the key names and the Lua
// scripts through which the aggregator adds deltas to the buffer and the
// sink hands the buffer over for flushing (design rules 5–7).
//
// Three keys per slot share one hash tag, so every script touches a single
// Redis Cluster slot:
//
//	walcount:{<slot>}:buffer    hash "<counter>:<key>" → delta, filling
//	walcount:{<slot>}:flushing  hash of the same shape, being flushed
//	walcount:{<slot>}:meta      hash: lsn, base, ffrom, fupto
//
// The keys describe a chain of transactions by end LSN. "flushing" holds
// the deltas of (ffrom, fupto]; "buffer" those of (base, lsn], where base
// equals fupto while a flush is in progress. W, the checkpoint in
// PostgreSQL, must equal the start of the chain; when it does not, or the
// keys are gone, Redis lost data and is reset to an empty chain at W
// (nothing past W was acknowledged, so the slot still holds it).
//
// LSNs are stored as 16 hex digits so that Lua compares them as strings:
// Lua numbers are doubles and cannot hold every 64-bit LSN.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package buffer
