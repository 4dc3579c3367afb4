package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/walcount/walcount/app/publication"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// checkPublication checks that the publication exists, publishes every
// operation walcount needs (TRUNCATE included: it is a barrier, design rule
// 10) and includes every source table with all its rows and the columns
// the counters read, and every target with its key (design rule 17). What
// it should hold is package publication's layout, which setup creates.
func (r *run) checkPublication() error {
	pub := r.ident(r.cfg.Publication)
	layout, unusable, err := r.publicationLayout()
	if err != nil {
		return r.queryFailed(CheckPublication, "tables of the counters", err)
	}
	r.reportUnpublishable(unusable)
	listed, sourceNames := r.layoutEntries(layout)
	flags, err := r.readPublication()
	if errNoRows(err) {
		r.reportNoPublication(pub, layout, listed)
		return nil
	}
	if err != nil {
		return r.queryFailed(CheckPublication, "publication "+r.cfg.Publication, err)
	}
	opsOK := r.checkOperations(pub, flags)
	genOK, err := r.checkGeneratedColumns(pub, layout)
	if err != nil {
		return r.queryFailed(CheckPublication, "publication "+r.cfg.Publication, err)
	}
	published, err := r.publishedTables()
	if err != nil {
		return r.queryFailed(CheckPublication, "tables of publication "+r.cfg.Publication, err)
	}
	rootOK := r.checkViaRoot(pub, layout, flags)
	tablesOK := r.checkPublishedTables(pub, layout, published, flags)
	if opsOK && genOK && rootOK && tablesOK {
		r.reportPublicationOK(layout, listed, sourceNames)
	}
	return nil
}

// publicationLayout returns what the publication should hold (package
// publication's layout) and the tables that cannot be in it.
func (r *run) publicationLayout() ([]publication.Table, []*counter.Table, error) {
	return publication.Layout(r.version, r.cfg.Counters, func(name string) (*counter.Table, error) {
		t, err := r.lookupTable(name)
		if err != nil {
			return nil, err
		}
		if name == cdc.MessageTable && !t.Exists && !r.stateMigrates() {
			// Made by walcount setup with the state schema, before the
			// publication: the publication must hold it all the same.
			// (An older state schema without it is migrated by run,
			// which adds the table to the publication as setup would.)
			return publication.MessagesTable(), nil
		}
		return t.Table, nil
	})
}

// reportUnpublishable reports the tables that cannot be in the
// publication: a source whose replica identity cannot carry what the
// counters read, a target without a replica identity.
func (r *run) reportUnpublishable(unusable []*counter.Table) {
	for _, t := range unusable {
		sql := r.qualified(t.Schema, t.Name)
		if why := publication.Unpublishable(r.version, t); why != "" {
			r.problem(CheckReplicaIdentity,
				fmt.Sprintf("%s cannot be in walcount's publication: %s", sql, why),
				fmt.Sprintf("give %s a primary key (or a unique index) holding the columns the counters read, then ALTER TABLE %s REPLICA IDENTITY DEFAULT; (or USING INDEX ...); or make the generated column STORED", sql, sql))
			continue
		}
		r.problem(CheckTargetIdentity,
			fmt.Sprintf("target %s has no replica identity (REPLICA IDENTITY %s without a usable key): walcount publishes its key to follow its deletes and key changes, and PostgreSQL would then refuse every UPDATE and DELETE on it",
				sql, identityName(t.ReplIdent)),
			fmt.Sprintf("ALTER TABLE %s ADD PRIMARY KEY (...); or ALTER TABLE %s REPLICA IDENTITY FULL;", sql, sql))
	}
}

// layoutEntries returns the layout's tables as the fixes list them
// (pubEntry) and the names of its sources.
func (r *run) layoutEntries(layout []publication.Table) (listed, sourceNames []string) {
	listed = make([]string, len(layout))
	for i, t := range layout {
		listed[i] = r.pubEntry(t)
		if t.Source {
			sourceNames = append(sourceNames, r.qualified(t.Schema, t.Name))
		}
	}
	return listed, sourceNames
}

// pubFlags is what pg_publication says of the publication.
type pubFlags struct {
	ins, upd, del, trunc, viaRoot, allTables bool
}

// readPublication reads the publication's row of pg_publication; its error
// is pgx.ErrNoRows when there is no such publication.
func (r *run) readPublication() (pubFlags, error) {
	var f pubFlags
	err := r.conn.QueryRow(r.ctx, `
SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot, puballtables
FROM pg_publication WHERE pubname = $1`, r.cfg.Publication).Scan(&f.ins, &f.upd, &f.del, &f.trunc, &f.viaRoot, &f.allTables)
	return f, err
}

// reportNoPublication reports that the publication does not exist, with
// the statement that creates it.
func (r *run) reportNoPublication(pub string, layout []publication.Table, listed []string) {
	fix := "walcount setup"
	if len(listed) > 0 {
		fix = r.ownerFix(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s%s;", pub, strings.Join(listed, ", "), publication.CreateOptions(r.version, layout)))
	}
	r.setupProblem(CheckPublication, fmt.Sprintf("publication %s does not exist", r.cfg.Publication), fix)
}

// checkOperations checks that the publication publishes insert, update,
// delete and truncate, and reports whether it does.
func (r *run) checkOperations(pub string, f pubFlags) bool {
	var ops []string
	for _, o := range []struct {
		on   bool
		name string
	}{{f.ins, "insert"}, {f.upd, "update"}, {f.del, "delete"}, {f.trunc, "truncate"}} {
		if !o.on {
			ops = append(ops, o.name)
		}
	}
	if len(ops) > 0 {
		r.setupProblem(CheckPublication,
			fmt.Sprintf("publication %s does not publish %s: those changes would never be counted", r.cfg.Publication, strings.Join(ops, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate');", pub))
		return false
	}
	return true
}

// checkGeneratedColumns checks, when a replica identity of the layout
// holds a generated column, that the publication publishes stored
// generated columns, and reports whether all is well. Its error is the
// query's.
func (r *run) checkGeneratedColumns(pub string, layout []publication.Table) (bool, error) {
	if !publication.Generated(r.version, layout) {
		return true, nil
	}
	var gencols string
	if err := r.conn.QueryRow(r.ctx, `SELECT pubgencols::text FROM pg_publication WHERE pubname = $1`, r.cfg.Publication).Scan(&gencols); err != nil {
		return false, err
	}
	if gencols == "s" {
		return true, nil
	}
	var held []string
	for _, t := range layout {
		if stored, _ := t.GeneratedInIdentity(); t.Columns == nil && len(stored) > 0 {
			held = append(held, fmt.Sprintf("%s (%s)", r.qualified(t.Schema, t.Name), strings.Join(stored, ", ")))
		}
	}
	r.setupProblem(CheckPublication,
		fmt.Sprintf("publication %s does not publish generated columns, and the replica identity of %s holds one: PostgreSQL %d refuses every UPDATE and DELETE of such a table while it is published (SQLSTATE 42P10)",
			r.cfg.Publication, strings.Join(held, ", "), r.version.Major()),
		fmt.Sprintf("ALTER PUBLICATION %s SET (publish_generated_columns = stored);", pub))
	return false, nil
}

// publishedTables reads the publication's tables from
// pg_publication_tables, by schema and name joined with a NUL.
func (r *run) publishedTables() (map[string]pubTable, error) {
	// pg_publication_tables resolves FOR ALL TABLES and FOR TABLES IN
	// SCHEMA; from PostgreSQL 15 on it also shows column lists (attnames
	// lists every column when there is none) and row filters.
	published := map[string]pubTable{}
	query := `SELECT schemaname::text, tablename::text, NULL::text[], NULL::text FROM pg_publication_tables WHERE pubname = $1`
	if r.version.PublicationColumnLists() {
		query = `SELECT schemaname::text, tablename::text, attnames::text[], rowfilter FROM pg_publication_tables WHERE pubname = $1`
	}
	rows, err := r.conn.Query(r.ctx, query, r.cfg.Publication)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var schema, name string
		var p pubTable
		if err := rows.Scan(&schema, &name, &p.columns, &p.rowFilter); err != nil {
			rows.Close()
			return nil, err
		}
		published[schema+"\x00"+name] = p
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return published, nil
}

// checkViaRoot checks that a publication of a partitioned table publishes
// via the partition root, and reports whether it does or need not.
func (r *run) checkViaRoot(pub string, layout []publication.Table, f pubFlags) bool {
	if !publication.ViaRoot(layout) || f.viaRoot {
		return true
	}
	// Without it pgoutput names each change by its partition, which
	// matches no counter.
	var parts []string
	for _, t := range layout {
		if t.Kind == "p" {
			parts = append(parts, r.qualified(t.Schema, t.Name))
		}
	}
	r.setupProblem(CheckPublication,
		fmt.Sprintf("%s is partitioned but publication %s does not publish via the partition root", strings.Join(parts, ", "), r.cfg.Publication),
		fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", pub))
	return false
}

// checkPublishedTables checks every table of the layout against the
// publication's tables (checkPublishedTable), and reports whether all are
// published as walcount needs.
func (r *run) checkPublishedTables(pub string, layout []publication.Table, published map[string]pubTable, f pubFlags) bool {
	ok := true
	for _, t := range layout {
		if !r.checkPublishedTable(pub, t, published, f) {
			ok = false
		}
	}
	return ok
}

// checkPublishedTable checks that the publication includes t with all its
// rows and the columns walcount reads of it, and reports whether it does
// (or the table is reported elsewhere, or need not be listed).
func (r *run) checkPublishedTable(pub string, t publication.Table, published map[string]pubTable, f pubFlags) bool {
	sql := r.qualified(t.Schema, t.Name)
	p, found := published[t.Schema+"\x00"+t.Name]
	if t.Kind == "p" && !f.viaRoot {
		// Reported above: without publish_via_partition_root the
		// publication lists the partitions, not the table.
		return true
	}
	if !found && t.Messages && f.allTables {
		return true // made by walcount setup, and published with it
	}
	if !found {
		msg := fmt.Sprintf("publication %s does not include %s", r.cfg.Publication, sql)
		switch {
		case t.Messages:
			msg += ": walcount's flush markers, reconciliation markers and corrections travel as its rows, and walcount would wait for them forever (run walcount setup, which creates the table in state schema version 3 and adds it)"
		case !t.Source:
			msg = fmt.Sprintf("publication %s does not include the target %s", r.cfg.Publication, sql)
		}
		r.setupProblem(CheckPublication, msg, r.ownerFix(fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pub, r.pubEntry(t))))
		return false
	}
	ok := true
	readd := fmt.Sprintf("ALTER PUBLICATION %[1]s DROP TABLE %[2]s; ALTER PUBLICATION %[1]s ADD TABLE %[3]s;", pub, sql, r.pubEntry(t))
	if p.rowFilter != nil {
		ok = false
		r.setupProblem(CheckPublication,
			fmt.Sprintf("publication %s filters the rows of %s (WHERE %s): walcount must see every row; put filters in the counter's where", r.cfg.Publication, sql, *p.rowFilter),
			readd)
	}
	if p.columns != nil {
		if missing := r.unpublishedColumns(t, p); len(missing) > 0 {
			ok = false
			r.setupProblem(CheckPublication,
				fmt.Sprintf("publication %s leaves out column %s of %s", r.cfg.Publication, strings.Join(missing, ", "), sql),
				readd)
		}
	}
	return ok
}

// unpublishedColumns returns, quoted, the columns of t walcount reads (a
// source's read columns, a target's key) that the publication's column
// list p leaves out.
func (r *run) unpublishedColumns(t publication.Table, p pubTable) []string {
	var need []string
	if t.Source {
		need = readColumns(r.cfg.Counters, &table{Table: t.Table})
	}
	for _, c := range r.cfg.Counters {
		if ts, tn := counter.SplitTable(c.Target); t.Target && ts == t.Schema && tn == t.Name && !slices.Contains(need, c.TargetKey) {
			need = append(need, c.TargetKey)
		}
	}
	var missing []string
	for _, col := range need {
		if _, exists := t.Table.Columns[col]; !exists {
			continue // a problem of the configuration, reported by checkColumns
		}
		if !slices.Contains(p.columns, col) {
			missing = append(missing, r.ident(col))
		}
	}
	return missing
}

// reportPublicationOK reports a publication that holds all walcount needs.
func (r *run) reportPublicationOK(layout []publication.Table, listed, sourceNames []string) {
	msg := fmt.Sprintf("publication %s publishes insert, update, delete and truncate of %s", r.cfg.Publication, strings.Join(sourceNames, ", "))
	var targets []string
	for i, t := range layout {
		if !t.Source && !t.Messages {
			targets = append(targets, listed[i])
		}
	}
	if len(targets) > 0 {
		msg += ", and follows the targets " + strings.Join(targets, ", ")
	}
	msg += "; walcount's own messages come as rows of " + cdc.MessageTable
	r.ok(CheckPublication, msg)
}

// pubEntry renders a table of the publication's layout for a fix: its
// name and column list, quoted as the server would.
func (r *run) pubEntry(t publication.Table) string {
	s := r.qualified(t.Schema, t.Name)
	if t.Columns != nil {
		cols := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			cols[i] = r.ident(c)
		}
		s += " (" + strings.Join(cols, ", ") + ")"
	}
	return s
}

// identityName spells pg_class.relreplident as ALTER TABLE does.
func identityName(replident string) string {
	switch replident {
	case "d":
		return "DEFAULT"
	case "f":
		return "FULL"
	case "i":
		return "USING INDEX"
	}
	return "NOTHING"
}

// pubTable is one row of pg_publication_tables.
type pubTable struct {
	columns   []string // nil before PostgreSQL 15
	rowFilter *string
}

// readColumns returns the source columns that the counters on t read.
func readColumns(counters []counter.Counter, t *table) []string {
	var cols []string
	add := func(c string) {
		if c != "" && !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
	}
	for _, c := range counters {
		if s, n := counter.SplitTable(c.Source); s != t.Schema || n != t.Name {
			continue
		}
		for _, col := range c.ReadColumnsOf(t.Table) {
			add(col)
		}
	}
	return cols
}

// ownerFix is the fix of a publication that is missing or lacks a table:
// stmt alone needs the owner of every table in the publication and, on
// first use, walcount's state schema (walcount.messages is in it), and a
// new counter's table also needs its grants and replica identity. With
// Options.OwnerSQL it is every statement, in order, and who runs them;
// without, stmt.
func (r *run) ownerFix(stmt string) string {
	if r.ownerSQL == nil {
		return stmt
	}
	var tables []string
	for _, c := range r.cfg.Counters {
		tables = append(tables, c.Source, c.Target)
	}
	var ownsAll bool
	if err := r.conn.QueryRow(r.ctx, `SELECT coalesce(bool_and(pg_has_role(current_user, c.relowner, 'USAGE')), false)
FROM unnest($1::text[]) AS t(name) JOIN pg_class c ON c.oid = to_regclass(t.name)`, tables).Scan(&ownsAll); err == nil && ownsAll {
		return fmt.Sprintf("walcount setup (role %s owns every table: it makes walcount's state schema, which holds walcount.messages, then the publication; add --fix-replica-identity when the replica identity check asks for it)", r.user)
	}
	if r.ownerSQLOut == nil && r.ownerSQLErr == nil {
		out, err := r.ownerSQL(r.ctx)
		r.ownerSQLOut, r.ownerSQLErr = &out, err
	}
	if r.ownerSQLErr != nil {
		return fmt.Sprintf("%s (after walcount's state schema, the grants and the replica identity; walcount setup --print-sql prints them all, but failed here: %v)", stmt, r.ownerSQLErr)
	}
	return fmt.Sprintf("role %[1]s does not own every table, so the owner of the tables runs all of these statements once, as printed "+
		"(walcount setup --print-sql --fix-replica-identity, with psql -v ON_ERROR_STOP=1 -f), then walcount setup runs as %[1]s:\n%[2]s", r.user, strings.TrimRight(*r.ownerSQLOut, "\n"))
}

// stateMigrates reports whether walcount's state schema exists at a version
// older than this walcount's: walcount run migrates it when it takes the
// slot, creating walcount.messages (version 3) and adding it to the
// publication, so its absence is not a problem of the publication.
func (r *run) stateMigrates() bool {
	v, err := state.ReadVersion(r.ctx, r.conn)
	return err == nil && v < state.Version
}
