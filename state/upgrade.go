package state

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/operator"
)

// Migrator is who may migrate the state schema forward: the owner of
// schema walcount, and whether the current role may act as it (it owns,
// or is a member of the role that owns, the schema and every relation in
// it, which the migrations create tables in, alter and grant on).
type Migrator struct {
	// Owner is the role that owns schema walcount.
	Owner string
	// Role is the current role.
	Role string
	// May is true when Role may run the migrations.
	May bool
}

// ReadMigrator reads who may migrate the state schema. The schema must
// exist.
func ReadMigrator(ctx context.Context, q Querier) (Migrator, error) {
	var m Migrator
	err := q.QueryRow(ctx, `
SELECT n.nspowner::regrole::text, current_user::text,
       pg_has_role(current_user, n.nspowner, 'USAGE')
       AND NOT EXISTS (SELECT 1 FROM pg_class c
                       WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'p', 'S', 'i', 'I')
                         AND NOT pg_has_role(current_user, c.relowner, 'USAGE'))
FROM pg_namespace n WHERE n.nspname = 'walcount'`).Scan(&m.Owner, &m.Role, &m.May)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, ErrNotSetUp
	}
	if err != nil {
		return m, fmt.Errorf("read the owner of schema walcount: %w", err)
	}
	return m, nil
}

// UpgradeSQL is the script that migrates a state schema of version from to
// Version when walcount's role may not (run as the schema's owner, in one
// transaction), followed by the grants that let role use what the
// migrations create.
func UpgradeSQL(from int, role string) []string {
	out := MigrationSQL(from)
	for _, g := range strings.Split(AccessGrants(pgx.Identifier{role}.Sanitize()), ";") {
		if g = strings.TrimSpace(g); g != "" {
			out = append(out, g)
		}
	}
	return out
}

// PublishMessagesSQL adds walcount.messages to publication pub: a state
// schema migrated from before version 3 needs it there (design rule 18).
// It needs the owner of the publication, as a member of walcount's role
// (which owns the table).
func PublishMessagesSQL(pub string) string {
	return fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE walcount.messages", pgx.Identifier{pub}.Sanitize())
}

// UpgradeScript is UpgradeSQL for a deployment that reads publication pub:
// a schema from before version 3 needs walcount.messages in it too.
func UpgradeScript(from int, role, pub string) []string {
	out := UpgradeSQL(from, role)
	if from < 3 {
		out = append(out, PublishMessagesSQL(pub))
	}
	return out
}

// MigrationPrivilegeError is an older state schema that walcount run would
// migrate by itself, but whose owner is another role. Nothing was changed:
// the owner runs Statements, once, and walcount is started again.
type MigrationPrivilegeError struct {
	From     int
	Migrator Migrator
	// Statements is UpgradeSQL's script for the owner.
	Statements []string
	// Err is PostgreSQL's refusal, when the migration was tried.
	Err error
}

func (e *MigrationPrivilegeError) Error() string {
	why := "it does not own schema walcount and every table in it"
	if e.Err != nil {
		why = e.Err.Error()
	}
	return fmt.Sprintf("walcount's state schema is version %d and this walcount needs version %d; walcount run migrates it by itself (the checkpoint and every carried delta kept), but role %s may not: %s. "+
		"Have role %s (the owner of schema walcount) run walcount setup with this configuration, or these statements in one transaction (psql -v ON_ERROR_STOP=1 -1 -f FILE), then start walcount again:\n%s",
		e.From, Version, e.Migrator.Role, why, e.Migrator.Owner, Script(e.Statements))
}

// Unwrap returns ErrSchemaVersion.
func (e *MigrationPrivilegeError) Unwrap() error { return ErrSchemaVersion }

// OperatorClass says a person must run the statements.
func (e *MigrationPrivilegeError) OperatorClass() operator.Class { return operator.Privilege }

// Script renders statements one per line, each ended by a semicolon,
// without the migrations' comment lines, so that it may be run as it is
// or folded onto one line.
func Script(statements []string) string {
	var b strings.Builder
	for _, s := range statements {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, t)
			}
		}
		for _, stmt := range strings.Split(strings.Join(lines, " "), ";") {
			if stmt = strings.TrimSpace(stmt); stmt != "" {
				b.WriteString(stmt + ";\n")
			}
		}
	}
	return strings.TrimRight(b.String(), "\n")
}
