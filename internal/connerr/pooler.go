package connerr

import "strings"

// StatementPoolingFix is the fix for a database_url at a connection pool in
// statement mode.
const StatementPoolingFix = "set pool_mode = transaction (or session) for this database in the pooler (pgbouncer.ini: pool_mode, or the database's pool_mode= in [databases]), or point database_url at PostgreSQL directly"

// StatementPooling reports whether err is a pooler's refusal of a
// transaction block in statement mode (PgBouncer answers one with the
// FATAL error "transaction blocks not allowed in statement pooling mode"
// and closes the connection). walcount applies each flush in one
// transaction, so no retry can succeed.
func StatementPooling(err error) bool {
	return err != nil && strings.Contains(err.Error(), "statement pooling mode")
}
