// Package testkit holds walcount's test kit: servers starts throwaway
// PostgreSQL, PgBouncer and Redis (single, TLS, cluster, Sentinel)
// processes, testenv shares them between a package's tests, appschema
// is the app's posts and likes that the tests count, wait waits on a
// condition instead of a sleep, and golden compares an output with a
// golden file of testdata (-update rewrites it); make demo's entry point,
// cmd/demo at the top of the tree, uses servers too.
//
// It is for walcount's own tests, demo and bench; not a stable API. The
// walcount binary links none of it (cmd/walcount's
// TestBinaryCarriesNoTestKit): walcount demo takes the URLs of servers
// that make demo, or its user, started.
package testkit
