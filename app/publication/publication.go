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
// From PostgreSQL 18 on, PostgreSQL refuses the app's UPDATE and DELETE
// of a published table whose replica identity holds a generated column
// the publication leaves out (SQLSTATE 42P10). A table published whole
// whose identity holds a STORED generated column (REPLICA IDENTITY FULL
// and any generated column) therefore needs publish_generated_columns =
// stored, which the layout then asks for (Generated); one with a VIRTUAL
// generated column under FULL can never be published and is unusable.
//
// See https://www.postgresql.org/docs/current/logical-replication-col-lists.html.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
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
// cdc.MessageTable too. A target without a usable replica identity, and
// on PostgreSQL 18 any table whose identity holds a VIRTUAL generated
// column, is left out and returned in unusable: publishing it would make
// every UPDATE and DELETE on it fail (Unpublishable says why).
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
		if Unpublishable(v, t.Table) != "" {
			unusable = append(unusable, t.Table)
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

// Unpublishable says why PostgreSQL v would refuse the app's UPDATE and
// DELETE of t once t is in a publication, whatever walcount asks of the
// publication; "" when it would not. A source without a usable identity
// is not one of these: walcount check reports it with the counter's
// columns, and an append_only source takes no UPDATE or DELETE.
func Unpublishable(v pgversion.Version, t *counter.Table) string {
	if _, virtual := t.GeneratedInIdentity(); len(virtual) > 0 && v.PublishGeneratedColumns() {
		return fmt.Sprintf("its replica identity is FULL and it has the VIRTUAL generated column %s, which no publication can carry: PostgreSQL %d refuses every UPDATE and DELETE of a published table whose identity holds an unpublished generated column",
			strings.Join(virtual, ", "), v.Major())
	}
	return ""
}

// Refusal says why table t of Layout's unusable cannot be published on
// PostgreSQL v, for an error.
func Refusal(v pgversion.Version, t *counter.Table) string {
	if why := Unpublishable(v, t); why != "" {
		return t.Ident() + ": " + why
	}
	return "target " + t.Ident() + " has no replica identity"
}

// Generated reports whether the publication must publish STORED
// generated columns (publish_generated_columns = stored, PostgreSQL
// 18+): a table published whole has a generated column in its replica
// identity.
func Generated(v pgversion.Version, tables []Table) bool {
	if !v.PublishGeneratedColumns() {
		return false
	}
	return slices.ContainsFunc(tables, func(t Table) bool {
		stored, _ := t.GeneratedInIdentity()
		return t.Columns == nil && len(stored) > 0
	})
}

// options renders the WITH options CREATE PUBLICATION needs for tables.
func options(v pgversion.Version, tables []Table) []string {
	var opts []string
	if ViaRoot(tables) {
		opts = append(opts, "publish_via_partition_root = true")
	}
	if Generated(v, tables) {
		opts = append(opts, "publish_generated_columns = stored")
	}
	return opts
}

// CreateOptions is the WITH clause of Create, "" when none is needed.
func CreateOptions(v pgversion.Version, tables []Table) string {
	if opts := options(v, tables); len(opts) > 0 {
		return " WITH (" + strings.Join(opts, ", ") + ")"
	}
	return ""
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

// Create is the statement that creates the publication pub for tables on
// PostgreSQL v.
func Create(v pgversion.Version, pub string, tables []Table) string {
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pgx.Identifier{pub}.Sanitize(), List(tables)) + CreateOptions(v, tables)
}

// Alter are the statements that make an existing publication pub hold
// tables, publish every operation walcount needs, publish through the
// partition root when a source is partitioned, and publish STORED
// generated columns when Generated. The options come first: on 18 the
// table list alone could put a table under a publication that does not
// yet publish its identity's generated columns.
func Alter(v pgversion.Version, pub string, tables []Table) []string {
	id := pgx.Identifier{pub}.Sanitize()
	opts := fmt.Sprintf("publish = 'insert, update, delete, truncate', publish_via_partition_root = %t", ViaRoot(tables))
	if Generated(v, tables) {
		opts += ", publish_generated_columns = stored"
	}
	return []string{
		fmt.Sprintf("ALTER PUBLICATION %s SET (%s)", id, opts),
		fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s", id, List(tables)),
	}
}

// Matches reports whether the existing publication pub already holds
// exactly tables, with their column lists (every column where Columns is
// nil) and no row filter, publishes every operation and publishes through
// the partition root exactly when ViaRoot(tables), and publishes STORED
// generated columns when Generated(v, tables). Setup then leaves it
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
	if Generated(v, tables) {
		var gencols string
		if err := q.QueryRow(ctx, `SELECT pubgencols::text FROM pg_publication WHERE pubname = $1`, pub).Scan(&gencols); err != nil {
			return false, fmt.Errorf("read publication %s: %w", pub, err)
		}
		if gencols != "s" {
			return false, nil
		}
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
		want, got := t.Columns, e.cols
		if want == nil {
			// Every column: pg_publication_tables lists the generated
			// ones on 15, never on 16 and 17, and on 18 the STORED ones
			// when the publication publishes them (Generated checked
			// that above); compare the others.
			want = make([]string, 0, len(t.Table.Columns))
			for name, c := range t.Table.Columns {
				if !c.Generated {
					want = append(want, name)
				}
			}
			got = slices.DeleteFunc(slices.Clone(e.cols), func(name string) bool { return t.Table.Columns[name].Generated })
		}
		if !sameSet(got, want) {
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
