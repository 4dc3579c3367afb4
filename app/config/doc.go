// Package config holds walcount's settings: the counters it maintains and
// the connection, slot and timing settings, with their documented defaults.
package config
