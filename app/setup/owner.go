package setup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/publication"
	"github.com/walcount/walcount/counter"
)

// ErrOwnerNeeded is wrapped when a step of setup or teardown needs the
// owner of a table or of the publication, which walcount's role is not.
var ErrOwnerNeeded = errors.New("this step needs the owner of the tables")

// OwnerNeededError says which step needs the owner and how the owner runs it.
type OwnerNeededError struct {
	// Step says what could not be done, e.g. "create publication walcount".
	Step string
	// Owned names what the role would have to own, and does not.
	Owned []string
	// Role is walcount's role, the current one.
	Role string
	// Hint says how the owner does it.
	Hint string
}

func (e *OwnerNeededError) Error() string {
	return fmt.Sprintf("%s needs the owner of %s, and role %s is not it: %s", e.Step, strings.Join(e.Owned, ", "), e.Role, e.Hint)
}

func (e *OwnerNeededError) Unwrap() error { return ErrOwnerNeeded }

// ownerHint is how the owner runs the statements setup cannot.
const ownerHint = "run walcount setup --print-sql (with walcount's configuration) and have the owner of the tables run its output once with psql -v ON_ERROR_STOP=1 -f; " +
	"the owner must be a member of walcount's role (GRANT <walcount's role> TO <owner>) to publish walcount.messages; then run walcount setup again"

// notOwned returns, of tables, the quoted names of those the current role
// does not own (directly, or as a member of the owning role; a superuser
// owns every table).
func notOwned(ctx context.Context, q counter.Querier, tables []*counter.Table) ([]string, error) {
	var schemas, names []string
	for _, t := range tables {
		schemas = append(schemas, t.Schema)
		names = append(names, t.Name)
	}
	rows, err := q.Query(ctx, `
SELECT t.s, t.n FROM unnest($1::text[], $2::text[]) AS t(s, n)
JOIN pg_namespace ns ON ns.nspname = t.s
JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n
WHERE NOT pg_has_role(current_user, c.relowner, 'USAGE')
ORDER BY 1, 2`, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("read the owners of the tables: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var s, n string
		err := row.Scan(&s, &n)
		return pgx.Identifier{s, n}.Sanitize(), err
	})
}

// ownsPublication reports whether the current role owns the publication
// pub (or may act as its owner), and whether it exists.
func ownsPublication(ctx context.Context, q counter.Querier, pub string) (owns, exists bool, err error) {
	err = q.QueryRow(ctx, `SELECT pg_has_role(current_user, pubowner, 'USAGE') FROM pg_publication WHERE pubname = $1`, pub).Scan(&owns)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("read the owner of publication %s: %w", pub, err)
	}
	return owns, true, nil
}

// publicationTables are the catalog tables of a layout.
func publicationTables(tables []publication.Table) []*counter.Table {
	out := make([]*counter.Table, len(tables))
	for i, t := range tables {
		out[i] = t.Table
	}
	return out
}

func currentUser(ctx context.Context, q counter.Querier) (string, error) {
	var u string
	if err := q.QueryRow(ctx, "SELECT current_user::text").Scan(&u); err != nil {
		return "", fmt.Errorf("read current_user: %w", err)
	}
	return u, nil
}
