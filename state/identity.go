package state

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ReplicaIdentity is the replica identity a table had before walcount
// setup set it to FULL: Ident is pg_class.relreplident ('d', 'n', 'i',
// 'f') and Index the index of 'i'.
type ReplicaIdentity struct {
	Relation string // quoted, qualified
	Ident    string
	Index    string
}

// RecordIdentitySQL records $1's identity $2 (and index $3) unless one is
// recorded: the first record is the app's own.
const RecordIdentitySQL = `INSERT INTO walcount.replica_identity (relation, relident, index_name) VALUES ($1, $2, nullif($3, '')) ON CONFLICT (relation) DO NOTHING`

// ReadIdentities returns the recorded replica identities, by relation.
func ReadIdentities(ctx context.Context, q Querier) ([]ReplicaIdentity, error) {
	rows, err := q.Query(ctx, `SELECT relation, relident, coalesce(index_name, '') FROM walcount.replica_identity ORDER BY relation`)
	if err != nil {
		return nil, fmt.Errorf("read the recorded replica identities: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReplicaIdentity, error) {
		var r ReplicaIdentity
		err := row.Scan(&r.Relation, &r.Ident, &r.Index)
		return r, err
	})
}

// RestoreSQL is the statement that gives the table back the identity it
// had: ALTER TABLE … REPLICA IDENTITY DEFAULT, NOTHING or USING INDEX.
func (r ReplicaIdentity) RestoreSQL() string {
	what := "DEFAULT"
	switch r.Ident {
	case "n":
		what = "NOTHING"
	case "f":
		what = "FULL"
	case "i":
		what = "USING INDEX " + pgx.Identifier{r.Index}.Sanitize()
	}
	return fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY %s", r.Relation, what)
}
