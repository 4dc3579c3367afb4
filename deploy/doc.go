// Package deploy holds walcount's deployment assets; it has no code.
//
//   - prometheus/alerts.yml: alerting rules on the metrics of docs/design.md §6,
//     with promtool unit tests in prometheus/alerts_test.yml.
//   - grafana/walcount.json: a Grafana dashboard of the same metrics.
//   - ../docker-compose.yml is checked here too: with no Docker engine on
//     the build machine, the test parses it as YAML and checks that every
//     published port is bound to loopback.
//
// The tests of this package keep the assets honest: they run
// `promtool check rules` and `promtool test rules`, and check that every
// PromQL expression in the rules and the dashboard names only metrics that
// internal/metrics exports, so that renaming a metric cannot silently break
// an alert or a panel.
package deploy
