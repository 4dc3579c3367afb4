// Package publication decides what walcount's publication holds, for
// walcount setup, which creates it, and walcount check, which verifies it.
//
// The sources are published whole, with every operation: their inserts,
// updates, deletes and truncates are what is counted. The targets are
// published too, so that their inserts, deletes and key changes reach the
// stream as barriers per key (design rule 17): from PostgreSQL 15 on with a
// column list of the target key, the counter columns and the replica
// identity columns (PostgreSQL requires those in a list when updates and
// deletes are published), so that walcount's own flushes and the app's
// other updates cost little to decode. A target whose replica identity is
// FULL is published whole, since a column list would have to name every
// column anyway. A partitioned source is published through its root
// (publish_via_partition_root), so its changes name the table the counters
// name.
//
// See https://www.postgresql.org/docs/current/logical-replication-col-lists.html.
package publication

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/pgversion"
)

// Table is one table of the publication.
type Table struct {
	*counter.Table
	// Source is true when counters count its rows; Target when it holds
	// counter columns. A table can be both.
	Source, Target bool
	// Columns is the column list, nil for every column.
	Columns []string
	// Messages is true for walcount's table of messages (cdc.MessageTable),
	// which every walcount publication holds: the messages walcount acts
	// on reach the stream as its rows (design rule 18).
	Messages bool
}

// MessagesTable is walcount's table of messages as state schema version 3
// creates it, for a Lookup that answers for a schema not yet migrated
// (setup --print-sql prints the migration before the publication).
func MessagesTable() *counter.Table {
	schema, name := counter.SplitTable(cdc.MessageTable)
	return &counter.Table{Schema: schema, Name: name, Exists: true, Kind: "r", ReplIdent: "d", Identity: []string{"id"}}
}

// SQL renders the table as a publication's table list names it.
func (t Table) SQL() string {
	s := t.Ident()
	if t.Columns != nil {
		cols := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			cols[i] = pgx.Identifier{c}.Sanitize()
		}
		s += " (" + strings.Join(cols, ", ") + ")"
	}
	return s
}

// Lookup returns the catalog facts of a canonical table name.
type Lookup func(canonical string) (*counter.Table, error)

// Layout returns the tables the publication must hold for counters, in a
// stable order and walcount's table of messages last, skipping tables that
// do not exist (walcount check reports them). lookup is asked for
// cdc.MessageTable too. A target without a usable replica identity is left out and
// returned in unusable: publishing it would make every UPDATE and DELETE
// on it fail.
func Layout(v pgversion.Version, counters []counter.Counter, lookup Lookup) (tables []Table, unusable []*counter.Table, err error) {
	byName := map[string]*Table{}
	var order []string
	get := func(name string) (*Table, error) {
		if t, ok := byName[name]; ok {
			return t, nil
		}
		ct, err := lookup(name)
		if err != nil {
			return nil, err
		}
		t := &Table{Table: ct}
		byName[name] = t
		order = append(order, name)
		return t, nil
	}
	targetCols := map[string][]string{}
	for _, c := range counters {
		src, err := get(c.Source)
		if err != nil {
			return nil, nil, err
		}
		src.Source = true
		tgt, err := get(c.Target)
		if err != nil {
			return nil, nil, err
		}
		tgt.Target = true
		for _, col := range []string{c.TargetKey, c.Column} {
			if !slices.Contains(targetCols[c.Target], col) {
				targetCols[c.Target] = append(targetCols[c.Target], col)
			}
		}
	}
	slices.Sort(order)
	for _, name := range order {
		t := byName[name]
		if !t.Exists {
			continue
		}
		if t.Target && !t.Source {
			if !t.IdentityUsable() {
				unusable = append(unusable, t.Table)
				continue
			}
			if v.PublicationColumnLists() && t.ReplIdent != "f" {
				cols := slices.Clone(t.Identity)
				for _, c := range targetCols[name] {
					if !slices.Contains(cols, c) {
						cols = append(cols, c)
					}
				}
				t.Columns = cols
			}
		}
		tables = append(tables, *t)
	}
	// Before the state schema exists there is no table of messages to
	// publish; walcount check reports the schema missing.
	msgs, err := lookup(cdc.MessageTable)
	if err != nil {
		return nil, nil, err
	}
	if msgs.Exists {
		tables = append(tables, Table{Table: msgs, Messages: true})
	}
	return tables, unusable, nil
}

// ViaRoot reports whether a table is partitioned, so that the publication
// must publish through the partition root: otherwise pgoutput names each
// change by its partition, which matches no counter.
func ViaRoot(tables []Table) bool {
	return slices.ContainsFunc(tables, func(t Table) bool { return t.Kind == "p" })
}

// List renders the table list of CREATE or ALTER PUBLICATION.
func List(tables []Table) string {
	parts := make([]string, len(tables))
	for i, t := range tables {
		parts[i] = t.SQL()
	}
	return strings.Join(parts, ", ")
}

// Create is the statement that creates the publication pub for tables.
func Create(pub string, tables []Table) string {
	s := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pgx.Identifier{pub}.Sanitize(), List(tables))
	if ViaRoot(tables) {
		s += " WITH (publish_via_partition_root = true)"
	}
	return s
}

// Alter are the statements that make an existing publication pub hold
// tables, publish every operation walcount needs, and publish through the
// partition root when a source is partitioned.
func Alter(pub string, tables []Table) []string {
	id := pgx.Identifier{pub}.Sanitize()
	return []string{
		fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s", id, List(tables)),
		fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate', publish_via_partition_root = %t)", id, ViaRoot(tables)),
	}
}

// Matches reports whether the existing publication pub already holds
// exactly tables, with their column lists (every column where Columns is
// nil) and no row filter, publishes every operation and publishes through
// the partition root exactly when ViaRoot(tables). Setup then leaves it
// alone: ALTER PUBLICATION needs the ownership of the publication and of
// every table in it, which a publication made by a DBA does not give
// walcount's role.
func Matches(ctx context.Context, q counter.Querier, v pgversion.Version, pub string, tables []Table) (bool, error) {
	var ins, upd, del, trunc, viaRoot bool
	err := q.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot FROM pg_publication WHERE pubname = $1`, pub).
		Scan(&ins, &upd, &del, &trunc, &viaRoot)
	if err != nil {
		return false, fmt.Errorf("read publication %s: %w", pub, err)
	}
	if !ins || !upd || !del || !trunc || viaRoot != ViaRoot(tables) {
		return false, nil
	}
	query := `SELECT schemaname::text, tablename::text, NULL::text[], false FROM pg_publication_tables WHERE pubname = $1`
	if v.PublicationColumnLists() {
		query = `SELECT schemaname::text, tablename::text, attnames::text[], rowfilter IS NOT NULL FROM pg_publication_tables WHERE pubname = $1`
	}
	rows, err := q.Query(ctx, query, pub)
	if err != nil {
		return false, fmt.Errorf("read tables of publication %s: %w", pub, err)
	}
	type entry struct {
		cols     []string
		filtered bool
	}
	published := map[string]entry{}
	for rows.Next() {
		var schema, name string
		var e entry
		if err := rows.Scan(&schema, &name, &e.cols, &e.filtered); err != nil {
			rows.Close()
			return false, fmt.Errorf("read tables of publication %s: %w", pub, err)
		}
		published[schema+"."+name] = e
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("read tables of publication %s: %w", pub, err)
	}
	if len(published) != len(tables) {
		return false, nil
	}
	for _, t := range tables {
		e, ok := published[t.Schema+"."+t.Name]
		if !ok || e.filtered {
			return false, nil
		}
		if !v.PublicationColumnLists() {
			continue
		}
		want := t.Columns
		if want == nil {
			want = make([]string, 0, len(t.Table.Columns))
			for c := range t.Table.Columns {
				want = append(want, c)
			}
		}
		if !sameSet(e.cols, want) {
			return false, nil
		}
	}
	return true, nil
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
