// Package testenv gives tests real PostgreSQL and Redis servers.
//
// It is part of the test kit (internal/testkit): for walcount's own tests,
// demo and bench; not a stable API.
//
// Two kinds of helper exist. Postgres and Redis start a private server
// process that the test controls (stop, crash, restart): crash tests need
// them, and they always need the local server binaries. Database and
// RedisURL give a test an isolated place on a server it does not control:
// a fresh database on a cluster shared by the whole test binary, and a Redis
// of its own.
//
// Where the shared servers come from, in order:
//
//  1. WALCOUNT_TEST_POSTGRES_URL / WALCOUNT_TEST_REDIS_URL: an external
//     server. Database still creates a fresh database there (the server needs
//     wal_level=logical); RedisURL leases one of the database indexes 1..15
//     and flushes it.
//  2. The local binaries (initdb, postgres, pg_ctl; redis-server), through
//     internal/testkit/servers.
//  3. Docker, when it answers a ping: containers started with
//     testcontainers-go (postgres:15 with wal_level=logical, redis:7).
//
// Local servers run the PostgreSQL binaries internal/testkit/servers selects: the
// locally installed ones, or, with WALCOUNT_TEST_PG=<major> (14 to 18), those
// of exactly that version, fetched beforehand with `make pg PG=<major>`
// (`make test-matrix` runs the core packages on every version). With
// WALCOUNT_TEST_PG set, a missing version fails the test with the command
// that fetches it instead of falling back to Docker, whose postgres:15
// would silently test another version; WALCOUNT_TEST_POSTGRES_URL still
// wins for Database, so do not set both. Tests that depend on a version's
// features ask servers.PostgresMajor, or Major of a started cluster.
//
// When none is available the test fails with a message that says what to
// install; it never skips. A test binary that uses Database should call Main
// from its TestMain, so that the shared servers are closed at the end.
package testenv
