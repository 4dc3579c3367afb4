package preflight

import (
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/connerr"
	"github.com/walcount/walcount/internal/redact"
)

// CheckPooler reports what a connection pooler in front of database_url
// breaks: a pool in statement mode, and a pool that routes database_url to
// another database than replication_url.
const CheckPooler = "pooler"

// errStopChecks ends the checks early, with the findings so far: what
// follows could only fail on the same cause, with raw errors.
var errStopChecks = errors.New("stop the checks")

// checkPooling probes database_url on a connection of its own with a
// transaction, as every flush is one (its deltas and the checkpoint commit
// together, design rule 2): a pool in statement mode (PgBouncer's
// pool_mode = statement) answers a transaction block with a FATAL error
// and closes the connection, so the flush could never commit, while each
// of the single statements the other checks run would pass. The probe's
// connection is its own because that error closes it.
func (r *run) checkPooling() error {
	// Sent at connection start, the session settings win over a role's
	// statement_timeout of a millisecond, which could cancel even the
	// BEGIN below before its SET LOCAL takes over (PostgreSQL then says
	// "canceling statement due to user request"; TestRoleTimeouts on a
	// busy machine). A pooler refuses them and gets the SET LOCALs only.
	probe, err := r.cfg.ConnectSQLWith(r.ctx, r.cfg.SessionSettings())
	if err != nil {
		return r.queryFailed(CheckPooler, "a transaction on database_url", err)
	}
	defer probe.Close(r.ctx)
	// One round trip opens the transaction and lifts the role's own
	// timeouts inside it (a role may set idle_in_transaction_session_timeout
	// to a millisecond, which walcount's own sessions override too), then
	// one commits it. Without arguments, pgx sends each as a simple query.
	_, err = probe.Exec(r.ctx, "BEGIN; SET LOCAL idle_in_transaction_session_timeout = 0; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
	if err == nil {
		_, err = probe.Exec(r.ctx, "COMMIT")
	}
	switch {
	case connerr.StatementPooling(err):
		r.configProblem(CheckPooler,
			fmt.Sprintf("database_url %s reaches a connection pool in statement mode (%v): walcount applies each flush in one transaction, which such a pool refuses, so run could never flush", redact.URL(r.cfg.DatabaseURL), err),
			connerr.StatementPoolingFix)
		return errStopChecks
	case err != nil:
		return r.queryFailed(CheckPooler, "a transaction on database_url", err)
	}
	return r.checkSameDatabase()
}

// databaseIdentity names the database a connection reached: the cluster's
// system identifier (the same on a physical standby as on its primary),
// the database's name and its oid.
type databaseIdentity struct {
	system string // empty when pg_control_system() may not be called
	name   string
	oid    uint32
}

func (d databaseIdentity) String() string {
	s := fmt.Sprintf("database %s (oid %d)", d.name, d.oid)
	if d.system != "" {
		s += " of system " + d.system
	}
	return s
}

func readDatabaseIdentity(r *run, conn *pgx.Conn) (databaseIdentity, error) {
	var id databaseIdentity
	err := conn.QueryRow(r.ctx, `SELECT current_database(), d.oid FROM pg_database d WHERE d.datname = current_database()`).Scan(&id.name, &id.oid)
	if err != nil {
		return id, err
	}
	// pg_control_system() is executable by PUBLIC on a stock server; a
	// managed one may revoke it, and the name and oid must do then.
	var system string
	if err := conn.QueryRow(r.ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&system); err == nil {
		id.system = system
	}
	return id, nil
}

// checkSameDatabase compares the database database_url reaches with the one
// replication_url does, when they are two URLs: a pooler whose alias routes
// database_url to another database would otherwise get the publication,
// the state and the counters in one database and the slot in the other.
func (r *run) checkSameDatabase() error {
	if !r.cfg.SeparateSlotServer() || r.slotConn == r.conn {
		return nil
	}
	sql, err := readDatabaseIdentity(r, r.conn)
	if err != nil {
		return r.queryFailed(CheckPooler, "which database database_url reaches", err)
	}
	repl, err := readDatabaseIdentity(r, r.slotConn)
	if err != nil {
		return r.queryFailed(CheckPooler, "which database replication_url reaches", err)
	}
	differ := sql.name != repl.name || sql.oid != repl.oid
	if sql.system != "" && repl.system != "" && sql.system != repl.system {
		differ = true
	}
	if differ {
		r.configProblem(CheckPooler,
			fmt.Sprintf("database_url %s reaches %s, but replication_url %s reaches %s: the slot would decode another database than the one whose counters walcount keeps (a pooler alias that routes to another database, or a URL of another server)",
				redact.URL(r.cfg.DatabaseURL), sql, redact.URL(r.cfg.ReplicationURL), repl),
			"point database_url and replication_url at the same database: in the pooler, the alias of database_url must name the database replication_url connects to (pgbouncer.ini [databases]: <alias> = host=... dbname=<that database>)")
		return errStopChecks
	}
	r.ok(CheckPooler, fmt.Sprintf("database_url and replication_url reach the same %s", sql))
	return nil
}
