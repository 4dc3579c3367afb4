package preflight

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/cdc"
)

// checkRole checks that the role may stream from a slot, emit walcount's
// marker messages and, before `walcount setup` has run, create the walcount
// schema.
func (r *run) checkRole() error {
	var super, repl, rdsRepl, canCreate, schemaExists, canEmit bool
	emit := r.version.EmitMessageSignature()
	err := r.conn.QueryRow(r.ctx, `
SELECT rolsuper, rolreplication,
       EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = 'rds_replication' AND pg_has_role(current_user, r.oid, 'MEMBER')),
       has_database_privilege(current_database(), 'CREATE'),
       to_regnamespace('walcount') IS NOT NULL,
       has_function_privilege($1, 'EXECUTE')
FROM pg_roles WHERE rolname = current_user`, emit).Scan(&super, &repl, &rdsRepl, &canCreate, &schemaExists, &canEmit)
	if err != nil {
		return r.queryFailed(CheckRole, "the role's attributes", err)
	}
	role := r.ident(r.user)

	switch {
	case super:
		r.ok(CheckRole, fmt.Sprintf("role %s is a superuser", r.user))
	case repl:
		r.ok(CheckRole, fmt.Sprintf("role %s has REPLICATION", r.user))
	case rdsRepl:
		// Amazon RDS and Aurora grant logical replication through
		// membership in rds_replication instead of the attribute. A role
		// of that name elsewhere grants nothing: the replication
		// connection below settles it.
		r.ok(CheckRole, fmt.Sprintf("role %s is a member of rds_replication, which grants logical replication on Amazon RDS and Aurora (not REPLICATION itself: on another server a role of that name grants nothing, and the replication connection check says whether it works)", r.user))
	default:
		r.accessProblem(CheckRole,
			fmt.Sprintf("role %s has neither REPLICATION nor SUPERUSER: it cannot create or stream from a replication slot", r.user),
			fmt.Sprintf("ALTER ROLE %s REPLICATION;", role))
	}
	if super || repl || rdsRepl {
		// The attribute is necessary, not sufficient: pg_hba.conf and
		// max_wal_senders decide too. A real walsender connection
		// settles it.
		r.checkReplicationConn()
	}

	if canEmit {
		r.ok(CheckEmitMessage, fmt.Sprintf("role %s may call pg_logical_emit_message (heartbeats, reconcile markers)", r.user))
	} else {
		r.accessProblem(CheckEmitMessage,
			fmt.Sprintf("role %s may not call pg_logical_emit_message: no heartbeats, so an idle slot pins WAL, and no reconcile", r.user),
			fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", emit, role))
	}

	if !schemaExists {
		if canCreate {
			r.ok(CheckCreateSchema, fmt.Sprintf("role %s may create schema walcount in database %s", r.user, r.database))
		} else {
			r.accessProblem(CheckCreateSchema,
				fmt.Sprintf("schema walcount does not exist and role %s may not create schemas in database %s", r.user, r.database),
				fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s;", r.ident(r.database), role))
		}
	}
	return nil
}

// sqlstateTooManyConnections is what PostgreSQL answers when every WAL
// sender is taken.
const sqlstateTooManyConnections = "53300"

// checkReplicationConn opens a logical replication connection
// (replication=database) and runs IDENTIFY_SYSTEM, as cdc/ will.
func (r *run) checkReplicationConn() {
	pc, err := pgconn.ParseConfig(r.cfg.ReplicationConnString())
	if err != nil {
		r.problem(CheckReplicationConn, fmt.Sprintf("cannot parse the database URL for a replication connection: %v", err), "")
		return
	}
	pc.RuntimeParams["replication"] = "database"
	// As cdc/ sets them.
	pc.RuntimeParams["statement_timeout"] = "0"
	pc.RuntimeParams["lock_timeout"] = "0"
	conn, err := pgconn.ConnectConfig(r.ctx, pc)
	if err != nil {
		fix := fmt.Sprintf("allow role %s to connect to database %s in pg_hba.conf", r.user, r.database)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstateTooManyConnections {
			fix = "raise max_wal_senders (see above), or stop an unused replication client"
		}
		if cdc.IsPoolerRefusal(err) {
			r.problem(CheckReplicationConn, fmt.Sprintf("%s: %v", cdc.ErrPooler, err), cdc.PoolerFix)
			return
		}
		r.problem(CheckReplicationConn, fmt.Sprintf("cannot open a replication connection: %v", err), fix)
		if refusedLogin(err) {
			r.findings[len(r.findings)-1].Cause = CauseAccess
		}
		return
	}
	defer conn.Close(r.ctx)
	sys, err := pglogrepl.IdentifySystem(r.ctx, conn)
	if err != nil {
		r.problem(CheckReplicationConn, fmt.Sprintf("IDENTIFY_SYSTEM failed on a replication connection: %v", err), "")
		return
	}
	r.history = fmt.Sprintf("%s/%d", sys.SystemID, sys.Timeline)
	r.ok(CheckReplicationConn, fmt.Sprintf("replication connection works (system %s, timeline %d)", sys.SystemID, sys.Timeline))
}
