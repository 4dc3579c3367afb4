// Package metrics defines every Prometheus metric walcount exports, in one
// struct registered into walcount's own registry.
//
// Keeping the whole set in one place makes the metric names a reviewable
// contract (docs/design.md §6): the alert rules in deploy/prometheus and the
// dashboard in deploy/grafana refer to these names, and tests in this package
// and in deploy/ fail when one of them goes missing.
//
// walcount uses its own *prometheus.Registry rather than the global default
// one so that a library walcount links cannot add series to /metrics behind
// its back, and so that tests can build a fresh Metrics per test.
//
// The slot gauges mirror what the slot monitor reads from
// pg_replication_slots and pg_stat_replication_slots; see
// https://www.postgresql.org/docs/current/view-pg-replication-slots.html and
// https://www.postgresql.org/docs/current/monitoring-stats.html#MONITORING-PG-STAT-REPLICATION-SLOTS-VIEW.
//
// All metric types of client_golang are safe for concurrent use, so one
// *Metrics is shared by every component of the daemon.
package metrics
