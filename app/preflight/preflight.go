package preflight

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/connerr"
	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/slot"
)

// Severity says how bad a Finding is.
type Severity int

const (
	// OK means the check passed.
	OK Severity = iota
	// Warning means walcount works but an operator should look: a risk or
	// a slow path, not a wrong count.
	Warning
	// Problem means walcount would fail or count wrongly; `walcount run`
	// must not start and `walcount check` exits 1.
	Problem
)

// String returns "ok", "warning" or "PROBLEM", the labels Format prints.
func (s Severity) String() string {
	switch s {
	case OK:
		return "ok"
	case Warning:
		return "warning"
	case Problem:
		return "PROBLEM"
	default:
		return fmt.Sprintf("Severity(%d)", int(s))
	}
}

// Names of the checks, the values of Finding.Check.
const (
	CheckServerVersion    = "server_version"
	CheckWALLevel         = "wal_level"
	CheckReplicationSlots = "max_replication_slots"
	CheckWALSenders       = "max_wal_senders"
	CheckRole             = "role"
	CheckReplicationConn  = "replication_connection"
	CheckEmitMessage      = "emit_message"
	CheckCreateSchema     = "create_schema"
	CheckTable            = "table"
	CheckColumn           = "column"
	CheckPrivilege        = "privilege"
	CheckIndex            = "index"
	CheckReplicaIdentity  = "replica_identity"
	CheckPublication      = "publication"
	CheckSlot             = "slot"
	CheckSlotWALKeepSize  = "max_slot_wal_keep_size"
	CheckIdleSlotTimeout  = "idle_replication_slot_timeout"
	CheckCheckpoint       = "checkpoint"
	CheckRedis            = "redis"
	CheckRedisWritable    = "redis_writable"
	CheckRedisEviction    = "redis_eviction"
	CheckTargetIdentity   = "target_identity"
	CheckOwnership        = "ownership"
	CheckRowSecurity      = "row_security"
	CheckLogged           = "logged"
	// CheckTargetRules reports the triggers and CHECK constraints that
	// act on the flush's UPDATE of a counter column.
	CheckTargetRules = "target_rules"
	// CheckOtherWriters reports the triggers and rules that write a
	// counter column walcount keeps: the app's own counter cache, left
	// in place.
	CheckOtherWriters = "other_writers"
)

// Cause says what must change to resolve a Finding.
type Cause int

const (
	// CauseEnvironment means the database, Redis or the server settings
	// must change (the usual case).
	CauseEnvironment Cause = iota
	// CauseConfig means walcount's own configuration names something
	// that is not there: the configuration must change. walcount check,
	// setup and run then exit with the usage status (2).
	CauseConfig
	// CauseSetup means walcount setup creates or fixes what is missing
	// (the publication, the slot, the state schema): setup goes ahead
	// where check and run refuse.
	CauseSetup
	// CauseUnreachable means a server did not answer (see Unreachable):
	// nothing needs to change but time, and walcount run waits for it.
	CauseUnreachable
	// CauseAccess means walcount's role or Redis user may not log in, or
	// lacks a privilege: a person must grant it (the fix says what to
	// run, and who). walcount check and run then exit 2, so that a
	// supervisor does not restart walcount in vain.
	CauseAccess
)

// Finding is the result of one check.
type Finding struct {
	// Check names the check (one of the Check constants).
	Check string
	// Severity is OK, Warning or Problem.
	Severity Severity
	// Cause is what must change; it matters for Problems only.
	Cause Cause
	// Message says what was found, naming the table, column or setting.
	Message string
	// Fix is the exact SQL, setting or command that resolves a Warning or
	// Problem; empty when there is nothing to run.
	Fix string
}

// Options configure Run.
type Options struct {
	// Config names the servers, the slot, the publication and the
	// counters to check.
	Config config.Config
	// Logger receives debug logs of each check; nil means no logging.
	Logger *zap.Logger
	// OwnerSQL, when set, returns every statement the owner of the tables
	// runs for walcount's role (walcount setup --print-sql): the fix of a
	// publication that is missing or lacks a table, which needs the
	// tables' owner and, before it, walcount's state schema, the grants
	// and the replica identity. walcount check sets it; nil keeps the
	// short fix (the statement alone).
	OwnerSQL func(ctx context.Context) (string, error)
}

// Log field keys.
const (
	logKeyCheck    = "check"
	logKeySeverity = "severity"
	logKeyProblems = "problems"
	logKeyWarnings = "warnings"
)

// Run runs every check and returns the findings in a stable order: server,
// role, tables per counter, publication, slot, checkpoint, Redis. The error
// is non-nil only when PostgreSQL cannot be reached at all (or ctx ends);
// Redis being down is a Finding. A check whose query fails unexpectedly is
// reported as a Problem naming the error, and the other checks go on.
func Run(ctx context.Context, opt Options) ([]Finding, error) {
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	cfg := opt.Config
	// Validate canonicalises table names; work on a copy of the counters so
	// that the caller's Config is left as it was.
	cfg.Counters = slices.Clone(cfg.Counters)
	if len(cfg.Counters) == 0 {
		cfg.Counters = []counter.Counter{counter.Default()}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate config: %w", err)
	}

	// The daemon's own session settings, so that the checks see what it
	// will (a role's statement_timeout of 1 ms fails neither).
	conn, err := cfg.ConnectSQLWith(ctx, cfg.SessionSettings())
	if err != nil {
		return nil, connerr.Postgres(err, cfg.DatabaseURL, cfg.OriginOf("database_url"))
	}
	defer conn.Close(context.WithoutCancel(ctx))

	r := &run{ctx: ctx, conn: conn, cfg: cfg, log: log, tables: map[string]*table{}, quoted: map[string]string{}, once: map[string]bool{}, ownerSQL: opt.OwnerSQL}
	defer func() {
		if r.closeSlotConn != nil {
			r.closeSlotConn()
		}
	}()
	steps := []func() error{
		r.connectSlotServer,
		r.checkPooling,
		r.checkServer,
		r.checkStandby,
		r.checkProvider,
		r.checkRole,
		r.checkOwnerSteps,
		r.checkCounters,
		r.checkPublication,
		r.checkSlot,
		r.checkWALKeepSize,
		r.checkIdleSlotTimeout,
		r.checkFailover,
		r.checkCheckpoint,
		r.checkOwnership,
	}
	for _, step := range steps {
		// A step records its own failed queries as Problems and returns
		// an error only when ctx has ended.
		err := step()
		if errors.Is(err, errStopChecks) {
			break
		}
		if err != nil {
			return r.findings, fmt.Errorf("run checks: %w", err)
		}
	}
	r.checkRedis()
	if ctx.Err() != nil {
		return r.findings, fmt.Errorf("run checks: %w", ctx.Err())
	}

	var problems, warnings int
	for _, f := range r.findings {
		switch f.Severity {
		case Problem:
			problems++
		case Warning:
			warnings++
		}
	}
	log.Debug("preflight checks done", zap.Int(logKeyProblems, problems), zap.Int(logKeyWarnings, warnings))
	return r.findings, nil
}

// HasProblems reports whether any finding is a Problem.
func HasProblems(findings []Finding) bool {
	return slices.ContainsFunc(findings, func(f Finding) bool { return f.Severity == Problem })
}

// run is the state of one Run: the connection, what has been learnt about
// the server so far and the findings.
type run struct {
	ctx  context.Context
	conn *pgx.Conn
	cfg  config.Config
	log  *zap.Logger
	// viaMissing holds the via tables already reported missing.
	viaMissing map[string]bool

	// Learnt by checkServer.
	version  pgversion.Version
	database string
	user     string
	// Learnt by checkSlot's early lookup in checkServer.
	slot *slot.Info
	// slotConn reaches the server that holds the slot (replication_url's
	// when it is another, see connectSlotServer); onStandby says it is a
	// hot standby.
	slotConn      *pgx.Conn
	closeSlotConn func()
	onStandby     bool
	// history is "<system identifier>/<timeline>" from IDENTIFY_SYSTEM,
	// learnt by checkReplicationConn; empty when it failed.
	history string
	// tables caches catalog facts by canonical "schema.table".
	tables map[string]*table
	// quoted caches quote_ident results.
	quoted map[string]string
	// once holds the causes reported once for every counter they concern
	// (a generated column several counters sum).
	once map[string]bool
	// ownerSQL is Options.OwnerSQL; ownerFix caches its answer.
	ownerSQL    func(ctx context.Context) (string, error)
	ownerSQLOut *string
	ownerSQLErr error

	findings []Finding
}

func (r *run) add(check string, sev Severity, msg, fix string) {
	r.log.Debug(msg, zap.String(logKeyCheck, check), zap.Stringer(logKeySeverity, sev))
	r.findings = append(r.findings, Finding{Check: check, Severity: sev, Message: msg, Fix: fix})
}

// configProblem records a Problem that the configuration must fix.
func (r *run) configProblem(check, msg, fix string) {
	r.add(check, Problem, msg, fix)
	r.findings[len(r.findings)-1].Cause = CauseConfig
}

// accessProblem records a Problem that a grant fixes (CauseAccess).
func (r *run) accessProblem(check, msg, fix string) {
	r.add(check, Problem, msg, fix)
	r.findings[len(r.findings)-1].Cause = CauseAccess
}

// setupProblem records a Problem that walcount setup fixes.
func (r *run) setupProblem(check, msg, fix string) {
	r.add(check, Problem, msg, fix)
	r.findings[len(r.findings)-1].Cause = CauseSetup
}

func (r *run) ok(check, msg string)           { r.add(check, OK, msg, "") }
func (r *run) warn(check, msg, fix string)    { r.add(check, Warning, msg, fix) }
func (r *run) problem(check, msg, fix string) { r.add(check, Problem, msg, fix) }

// queryFailed records a query that should not fail. It returns the
// context's error when the run is being cancelled, so that callers stop.
func (r *run) queryFailed(check, what string, err error) error {
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	r.problem(check, fmt.Sprintf("cannot check %s: %v", what, err), "")
	return nil
}

// ident returns name as PostgreSQL would write it in SQL: quoted only where
// needed, keywords included. It asks the server (quote_ident) because only
// the server knows its keywords.
func (r *run) ident(name string) string {
	if q, ok := r.quoted[name]; ok {
		return q
	}
	var q string
	if err := r.conn.QueryRow(r.ctx, "SELECT quote_ident($1)", name).Scan(&q); err != nil {
		q = pgx.Identifier{name}.Sanitize()
	}
	r.quoted[name] = q
	return q
}

// qualified returns schema.table for SQL in a fix.
func (r *run) qualified(schema, table string) string {
	return r.ident(schema) + "." + r.ident(table)
}

// errNoRows reports whether err says a query found no row.
func errNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
