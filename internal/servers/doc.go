// Package servers starts private, throwaway PostgreSQL and Redis server
// processes on the loopback interface. walcount's tests use it (through
// internal/testenv) to run against the real thing, and `walcount demo` uses it
// to bring up a self-contained environment.
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
