// Package counter is walcount's domain: what a counter cache is, how a row
// contributes to it, and the SQL that reads and writes it.
//
// A Counter declares that the rows of a source table, grouped by a key
// column, are counted (or one of their numeric columns summed) into a
// column of the target row whose target key equals the key. A row change
// contributes contribution(new) − contribution(old) to the keys it touches,
// so an UPDATE that moves a like from one post to another yields −1 and
// +1, and a no-op UPDATE yields nothing.
//
// Sums are exact: a numeric(p,s) column is summed as an int64 count of
// 10^-s units (SumScale, ParseScaled), and the flush divides the delta back
// into the counter column, which must keep s fractional digits.
//
// Resolve reads the catalog once per counter and returns the statements
// every other package runs: the flush UPDATE and the TRUNCATE reset (sink),
// and the key scan, truth and column reads of reconciliation. Keys travel as
// text in the form pgoutput sends them, which is also the form of the Redis
// buffer's fields ("counter:key", see Field).
//
// See https://www.postgresql.org/docs/current/datatype-numeric.html for the
// numeric type modifier and https://www.postgresql.org/docs/current/catalog-pg-attribute.html.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package counter
