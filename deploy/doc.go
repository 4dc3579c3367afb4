// Package deploy holds walcount's deployment assets; it has no code.
//
//   - prometheus/alerts.yml: alerting rules on the metrics of docs/design.md §6,
//     with promtool unit tests in prometheus/alerts_test.yml; its group
//     walcount-postgres reads PostgreSQL's own view of the slot from
//     postgres_exporter, with the custom queries of
//     prometheus/postgres_exporter.yml (run on a real server by
//     TestPostgresExporterQueries).
//   - grafana/walcount.json: a Grafana dashboard of the same metrics.
//   - systemd/walcount.service and walcount.env: the unit the packages
//     install, checked with systemd-analyze verify and security.
//   - packaging/: the .deb/.rpm maintainer scripts (../.goreleaser.yaml).
//   - helm/walcount: the Helm chart, checked with helm lint and helm
//     template (the pinned helm of ../scripts/go-tool.sh); its
//     files/alerts.yml is kept equal to prometheus/alerts.yml.
//   - ../docker-compose.yml and ../Dockerfile are checked here too: the
//     tests parse them, check that every published port is bound to
//     loopback, that base images are pinned by digest, that BASE=local
//     pulls none and that the image's build flags stamp its version.
//   - image_test.go (WALCOUNT_TEST_IMAGE=1, make test-image, with a Docker
//     engine) builds the image with BASE=local and runs it, and the
//     compose file's walcount services, on throwaway servers.
//   - release_test.go (build tag release, make test-release) runs
//     goreleaser and checks the archive, the packages and the binary.
//
// The tests of this package keep the assets honest: they run
// `promtool check rules` and `promtool test rules`, and check that every
// PromQL expression in the rules and the dashboard names only metrics that
// internal/metrics exports, so that renaming a metric cannot silently break
// an alert or a panel.
package deploy
