// Package config holds walcount's settings: the counters it maintains and
// the connection, slot and timing settings, with their documented defaults.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
package config
