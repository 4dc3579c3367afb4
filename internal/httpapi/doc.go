// Package httpapi is walcount's HTTP server: the operational endpoints of
// docs/design.md §6 and the reconcile trigger.
//
//	GET  /healthz       200 "ok" for as long as the process serves HTTP
//	                    (liveness: restart the process if this fails)
//	GET  /readyz        200 "ready", or 503 with the reason (readiness:
//	                    the stream is behind, the slot is unhealthy, ...)
//	GET  /status        the daemon's state as pretty-printed JSON
//	GET  /metrics       Prometheus exposition of internal/metrics
//	POST /v1/reconcile  handed to Options.Reconcile; 501 when there is none
//	GET  /v1/reconcile/{id}  one run, also handed to Options.Reconcile
//
// When Options.Token is set, every POST needs "Authorization: Bearer
// <token>" and gets a 401 without it; the GET endpoints stay open, since
// they change nothing and probes and scrapers carry no token. Start warns
// when the server listens beyond loopback without a token.
//
// The server knows nothing of walcount's internals: the daemon supplies
// readiness and status as functions, so that this package depends only on
// net/http and the metrics registry. Whatever the status function returns is
// served as is, so it must not contain secrets (mask URLs with
// internal/redact).
package httpapi
