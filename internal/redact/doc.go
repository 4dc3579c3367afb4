// Package redact masks secrets in connection strings before they are logged,
// printed or returned in an error or in /status (docs/design.md §6: secrets never
// appear in logs).
//
// It knows the two forms PostgreSQL accepts
// (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING):
// URLs (postgres://user:password@host/db?password=...) and key=value
// strings (host=... password='...'), and the Redis URL form
// (redis://user:password@host:port/db). When a string cannot be parsed it is
// masked by pattern, erring towards hiding too much.
package redact
