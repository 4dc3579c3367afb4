package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/publication"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// printer writes the SQL of setup --print-sql: statements, each ending in
// exactly one semicolon, and comments that say what each group needs.
type printer struct {
	out io.Writer
	res *Result
}

func (p *printer) comment(format string, args ...any) {
	if p.out == nil {
		return
	}
	for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		fmt.Fprintln(p.out, strings.TrimRight("-- "+line, " "))
	}
}

func (p *printer) blank() {
	if p.out != nil {
		fmt.Fprintln(p.out)
	}
}

func (p *printer) stmt(sql string) {
	sql = strings.TrimRight(strings.TrimSpace(sql), ";")
	p.res.Statements = append(p.res.Statements, sql)
	if p.out != nil {
		fmt.Fprintf(p.out, "%s;\n", sql)
	}
}

// bind replaces $1, $2, … by quoted literals, for printing.
func bind(sql string, args ...any) string {
	for i := len(args) - 1; i >= 0; i-- {
		sql = strings.ReplaceAll(sql, fmt.Sprintf("$%d", i+1), quoteLiteral(fmt.Sprint(args[i])))
	}
	return sql
}

// printSQL writes, without running anything, the SQL that the owner of the
// tables runs once for walcount's role (the current role): walcount's state
// schema (as walcount's role, through SET ROLE), the privileges walcount's
// role lacks on the tables, the replica identity fixes when asked, and the
// publication, handed over to walcount's role. The slot and its checkpoint,
// which need REPLICATION and which walcount setup makes as walcount's role,
// follow as comments. The output is valid SQL for psql -v ON_ERROR_STOP=1.
// When a counter's table does not exist it says so, prints no publication,
// and returns an error.
func printSQL(ctx context.Context, conn *pgx.Conn, cfg config.Config, version pgversion.Version, opt Options, res *Result) error {
	p := &printer{out: opt.Out, res: res}
	user, db, err := currentRole(ctx, conn)
	if err != nil {
		return err
	}
	role := pgx.Identifier{user}.Sanitize()
	printHeader(p, cfg, user, db)

	// The counters' tables, as the catalog has them.
	tables := map[string]*counter.Table{}
	lookup := cachedLookup(ctx, conn, tables)
	// 1. The state schema, owned by walcount's role.
	from, stateOwner, err := printStateSchema(ctx, conn, p, user, db)
	if err != nil {
		return err
	}

	// 2. What walcount's role reads and writes in the app's tables.
	if err := printGrants(ctx, conn, p, cfg.Counters, lookup, user, role); err != nil {
		return err
	}

	// 3. Replica identity, when asked.
	if opt.FixReplicaIdentity {
		if err := printIdentityFixes(ctx, conn, p, res, cfg.Counters, tables, stateOwner); err != nil {
			return err
		}
	}

	// The via tables of counters removed from the configuration.
	if err := printDropRemovedVia(ctx, conn, p, res, cfg); err != nil {
		return err
	}

	// The via tables of the counters through a parent: the publication
	// includes them.
	if err := printViaTables(p, cfg.Counters, lookup, tables, stateOwner); err != nil {
		return err
	}
	missing, err := missingTables(cfg.Counters, lookup)
	if err != nil {
		return err
	}

	// 4. The publication.
	p.blank()
	pub := pgx.Identifier{cfg.Publication}.Sanitize()
	if len(missing) > 0 {
		p.comment("4. The publication: NOT PRINTED, because %s does not exist.\n"+
			"   Create the table (the app's migration), then run walcount setup --print-sql again.", strings.Join(missing, ", "))
	} else if err := printPublication(ctx, conn, p, cfg, version, lookup, from == state.Version, user, stateOwner, db, pub); err != nil {
		return err
	}

	// 5. The slot.
	if err := printSlot(ctx, conn, p, cfg, version, opt, user); err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("no publication printed: %s does not exist; create it, then run walcount setup --print-sql again", strings.Join(missing, ", "))
	}
	return nil
}

// printViaTables prints the via tables that do not exist yet of the
// counters through a parent (counter.ViaTableSQL), created as the owner of
// walcount's state schema, with a via row of zeros for every parent row
// (counter.ViaSeedSQL), and records them in tables as existing, so that
// the publication that follows includes them. walcount setup does the
// same when run as that role; a missing parent key or counter column
// creates none (check names it).
func printViaTables(p *printer, counters []counter.Counter, lookup publication.Lookup, tables map[string]*counter.Table, stateOwner string) error {
	var stmts []string
	var names []string
	for _, c := range counters {
		if c.Through == nil || c.IsVia() {
			continue
		}
		name := counter.ViaTable(c.Through.Counter)
		via, err := lookup(name)
		if err != nil {
			return err
		}
		if via.Exists {
			continue
		}
		create, err := viaTableStatements(c, lookup)
		if err != nil {
			return err
		}
		if create == nil {
			continue
		}
		stmts = append(stmts, create...)
		names = append(names, via.Ident())
		schema, table := counter.SplitTable(name)
		tables[name] = &counter.Table{Schema: schema, Name: table, Exists: true, Kind: "r", ReplIdent: "f"}
	}
	if len(stmts) == 0 {
		return nil
	}
	p.blank()
	p.comment("walcount's via tables (%s) of the counters through a parent, created as and\n"+
		"   owned by %s, each with a row of zeros for every parent row. walcount setup does this itself\n"+
		"   when run as %[2]s; it is here because the publication below includes them.\n"+
		"   Needs: membership in role %[2]s, and the SELECT on the parents granted above.", strings.Join(names, ", "), stateOwner)
	role := pgx.Identifier{stateOwner}.Sanitize()
	p.stmt("SET ROLE " + role)
	for _, stmt := range stmts {
		p.stmt(stmt)
	}
	p.stmt("RESET ROLE")
	return nil
}

// currentRole returns the current role and database: walcount's role, and
// the database the SQL is for.
func currentRole(ctx context.Context, conn *pgx.Conn) (user, db string, err error) {
	if err := conn.QueryRow(ctx, "SELECT current_user::text, current_database()::text").Scan(&user, &db); err != nil {
		return "", "", fmt.Errorf("read current role: %w", err)
	}
	return user, db, nil
}

// printHeader prints the comment that opens the SQL: for whom it is, and
// how to run it.
func printHeader(p *printer, cfg config.Config, user, db string) {
	p.comment("walcount setup --print-sql: what the owner of the tables runs once for walcount's role %s\n"+
		"(slot %q, publication %q, database %s). Run it as the tables' owner:\n"+
		"    psql -v ON_ERROR_STOP=1 -f this-file.sql\n"+
		"then run walcount setup as %s: it creates the slot and leaves what exists and matches alone.\n"+
		"Each group says what it needs; a group that has nothing to do says so.",
		user, cfg.Slot, cfg.Publication, db, user)
}

// cachedLookup returns a lookup of tables in the catalog that reads each
// table once and keeps it in tables.
func cachedLookup(ctx context.Context, conn *pgx.Conn, tables map[string]*counter.Table) publication.Lookup {
	return func(name string) (*counter.Table, error) {
		if t, ok := tables[name]; ok {
			return t, nil
		}
		schema, table := counter.SplitTable(name)
		t, err := counter.ReadTable(ctx, conn, schema, table)
		if err != nil {
			return nil, err
		}
		tables[name] = t
		return t, nil
	}
}

// missingTables returns the sources and targets of the counters that do
// not exist, each once, in the order of the counters.
func missingTables(counters []counter.Counter, lookup publication.Lookup) ([]string, error) {
	var missing []string
	for _, c := range counters {
		for _, name := range []string{c.Source, c.Target} {
			t, err := lookup(name)
			if err != nil {
				return nil, err
			}
			if !t.Exists && !containsString(missing, t.Ident()) {
				missing = append(missing, t.Ident())
			}
		}
	}
	return missing, nil
}

// printStateSchema prints group 1: walcount's state schema, created or
// migrated as its owner (walcount's role when there is none yet). It
// returns the version the schema is at now and its owner.
func printStateSchema(ctx context.Context, conn *pgx.Conn, p *printer, user, db string) (from int, stateOwner string, err error) {
	p.blank()
	from, err = state.ReadVersion(ctx, conn)
	if errors.Is(err, state.ErrNotSetUp) {
		from, err = 0, nil
	}
	if err != nil {
		return 0, "", err
	}
	stateOwner = user
	if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT r.rolname::text FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE n.nspname = 'walcount'), $1)", user).Scan(&stateOwner); err != nil {
		return 0, "", fmt.Errorf("read the owner of schema walcount: %w", err)
	}
	switch {
	case from > state.Version:
		return 0, "", &state.NewerError{Found: from}
	case from == state.Version:
		p.comment("1. walcount's state schema is at version %d, owned by %s: nothing to do.", from, stateOwner)
	default:
		p.comment("1. walcount's state schema (version %d), created as and owned by %s, so that its\n"+
			"   later migrations need no new GRANT. walcount setup does this itself when run as %[2]s;\n"+
			"   it is here because the publication below includes walcount.messages.\n"+
			"   Needs: membership in role %[2]s (for SET ROLE), and CREATE on database %[3]s for %[2]s.", state.Version, stateOwner, db)
		p.stmt("SET ROLE " + pgx.Identifier{stateOwner}.Sanitize())
		p.stmt("BEGIN")
		for _, stmt := range state.MigrationSQL(from) {
			p.stmt(stmt)
		}
		p.stmt("COMMIT")
		p.stmt("RESET ROLE")
	}
	return from, stateOwner, nil
}

// printGrants prints group 2: the privileges walcount's role lacks on the
// app's tables.
func printGrants(ctx context.Context, conn *pgx.Conn, p *printer, counters []counter.Counter, lookup publication.Lookup, user, role string) error {
	p.blank()
	grants, err := missingGrants(ctx, conn, counters, lookup, role)
	if err != nil {
		return err
	}
	if len(grants) == 0 {
		p.comment("2. Privileges on the tables: %s has every one walcount needs.", user)
		return nil
	}
	p.comment("2. Privileges walcount's role needs on the tables: reading the sources (backfill and\n" +
		"   reconciliation) and updating the counter columns (the flush).\n" +
		"   Needs: ownership of the tables (or the GRANT OPTION).")
	for _, g := range grants {
		p.stmt(g)
	}
	return nil
}

// printIdentityFixes prints group 3: the replica identity fixes
// (--fix-replica-identity), and records the tables they fix in res.
func printIdentityFixes(ctx context.Context, conn *pgx.Conn, p *printer, res *Result, counters []counter.Counter, tables map[string]*counter.Table, stateOwner string) error {
	p.blank()
	s := &statements{conn: conn, print: true, res: &Result{}, stateRole: stateOwner}
	fixed, err := s.fixIdentity(ctx, existing(counters, tables))
	if err != nil {
		return err
	}
	res.FixedIdentityTable = fixed
	if len(s.res.Statements) == 0 {
		p.comment("3. Replica identity: every source's identity carries the counters' columns: nothing to do.")
		return nil
	}
	p.comment("3. Replica identity FULL, so that updates and deletes carry the columns the counters read;\n"+
		"   the identity each table had is recorded first (as %s), for walcount teardown to restore.\n"+
		"   Needs: ownership of each table, and membership in role %[1]s.", stateOwner)
	for _, stmt := range s.res.Statements {
		p.stmt(stmt)
	}
	return nil
}

// printDropRemovedVia prints, when there are any, the drops of the via
// tables of counters removed from the configuration, and records them in
// res.
func printDropRemovedVia(ctx context.Context, conn *pgx.Conn, p *printer, res *Result, cfg config.Config) error {
	drop := &statements{conn: conn, print: true, res: &Result{}}
	if err := drop.dropRemovedVia(ctx, conn, cfg.Slot, cfg.Counters); err != nil {
		return err
	}
	if len(drop.res.Statements) == 0 {
		return nil
	}
	p.blank()
	p.comment("The via tables of counters through a parent that are no longer configured: nothing reads\n" +
		"them any more (walcount setup drops them itself when run as their owner).\n" +
		"Needs: ownership of the tables, or membership in their owner (walcount's role).")
	for _, stmt := range drop.res.Statements {
		p.stmt(stmt)
	}
	res.DroppedVia = drop.res.DroppedVia
	return nil
}

// printSlot prints group 5, as comments only: the replication slot and its
// checkpoint, which walcount setup creates as walcount's role.
func printSlot(ctx context.Context, conn *pgx.Conn, p *printer, cfg config.Config, version pgversion.Version, opt Options, user string) error {
	p.blank()
	slotExists, err := slot.Exists(ctx, conn, cfg.Slot)
	if err != nil {
		return fmt.Errorf("read replication slot: %w", err)
	}
	if slotExists && !opt.RecreateSlot {
		p.comment("5. Replication slot %q exists: nothing to do.", cfg.Slot)
		return nil
	}
	p.comment("5. The replication slot and its checkpoint: walcount setup creates them as %s, once the\n"+
		"   publication exists (needs REPLICATION, or superuser). For reference only, not run here:", user)
	var lines []string
	if slotExists {
		lines = append(lines, bind(slot.DropSQL, cfg.Slot)+";")
	}
	lines = append(lines, bind(slot.CreateSQL(version), cfg.Slot)+";", bind(slot.InitCheckpointSQL, cfg.Slot)+";")
	p.comment("%s", "    "+strings.ReplaceAll(strings.Join(lines, "\n"), "\n", "\n    "))
	return nil
}

// printPublication prints group 4: the publication, created or altered,
// and handed over to walcount's role so that walcount teardown may drop it.
func printPublication(ctx context.Context, conn *pgx.Conn, p *printer, cfg config.Config, version pgversion.Version,
	lookup publication.Lookup, stateReady bool, user, stateOwner, db, pub string) error {
	layout, unusable, err := publication.Layout(version, cfg.Counters, func(name string) (*counter.Table, error) {
		if name == cdc.MessageTable && !stateReady {
			// Created by group 1 above.
			return publication.MessagesTable(), nil
		}
		return lookup(name)
	})
	if err != nil {
		return err
	}
	if len(unusable) > 0 {
		p.comment("4. The publication: NOT PRINTED, because %s (walcount check says how to fix it).", publication.Refusal(version, unusable[0]))
		return fmt.Errorf("no publication printed: %s: walcount check says how to fix it", publication.Refusal(version, unusable[0]))
	}
	var names []string
	for _, t := range layout {
		if !t.Messages {
			names = append(names, t.Ident())
		}
	}
	var exists bool
	var owner string
	err = conn.QueryRow(ctx, "SELECT r.rolname::text FROM pg_publication p JOIN pg_roles r ON r.oid = p.pubowner WHERE p.pubname = $1", cfg.Publication).Scan(&owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("read publication: %w", err)
	default:
		exists = true
	}
	matches := false
	if exists && stateReady {
		if matches, err = publication.Matches(ctx, conn, version, cfg.Publication, layout); err != nil {
			return err
		}
	}
	role := pgx.Identifier{user}.Sanitize()
	handOver := func() {
		if owner == user {
			return
		}
		p.comment("   Handed over to %s, so that walcount teardown can drop it.\n"+
			"   Needs: membership in role %[1]s, and CREATE on database %[2]s for %[1]s.", user, db)
		p.stmt(fmt.Sprintf("ALTER PUBLICATION %s OWNER TO %s", pub, role))
	}
	switch {
	case matches:
		p.comment("4. Publication %s already holds exactly what walcount needs: nothing to do (setup never alters it).", cfg.Publication)
		handOver()
	case exists:
		p.comment("4. Publication %s exists but does not hold exactly what walcount needs; make it so.\n"+
			"   Needs: ownership of the publication (owned by %s), of %s, and of walcount.messages\n"+
			"   (owned by %s: membership in that role counts).", cfg.Publication, owner, strings.Join(names, ", "), stateOwner)
		for _, stmt := range publication.Alter(version, cfg.Publication, layout) {
			p.stmt(stmt)
		}
		handOver()
	default:
		p.comment("4. The publication of the sources, the targets and walcount.messages.\n"+
			"   Needs: CREATE on database %s, ownership of %s, and of walcount.messages\n"+
			"   (owned by %s: membership in that role counts).", db, strings.Join(names, ", "), stateOwner)
		p.stmt(publication.Create(version, cfg.Publication, layout))
		handOver()
	}
	return nil
}

// missingGrants returns the GRANT statements that give role (the current
// one) what walcount does with the counters' tables: SELECT on each source,
// SELECT on each target's key and counter column, UPDATE on the counter
// column, and INSERT on the columns a create_missing counter writes a
// created row with. Tables that do not exist are skipped.
func missingGrants(ctx context.Context, conn *pgx.Conn, counters []counter.Counter, lookup publication.Lookup, role string) ([]string, error) {
	type need struct{ sel, upd, ins []string }
	var order []string
	wants := map[string]*need{}
	add := func(t *counter.Table, sel, upd, ins []string) {
		n, ok := wants[t.Ident()]
		if !ok {
			n = &need{}
			wants[t.Ident()] = n
			order = append(order, t.Ident())
		}
		for _, c := range sel {
			if !containsString(n.sel, c) {
				n.sel = append(n.sel, c)
			}
		}
		for _, c := range upd {
			if !containsString(n.upd, c) {
				n.upd = append(n.upd, c)
			}
		}
		for _, c := range ins {
			if !containsString(n.ins, c) {
				n.ins = append(n.ins, c)
			}
		}
	}
	srcOID := map[string]uint32{}
	for _, c := range counters {
		src, err := lookup(c.Source)
		if err != nil {
			return nil, err
		}
		tgt, err := lookup(c.Target)
		if err != nil {
			return nil, err
		}
		if src.Exists {
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1::oid, 'SELECT')", src.OID).Scan(&ok); err != nil {
				return nil, fmt.Errorf("read privileges on %s: %w", src.Ident(), err)
			}
			if !ok {
				srcOID[src.Ident()] = src.OID
				add(src, nil, nil, nil)
			}
		}
		if !tgt.Exists {
			continue
		}
		var sel, upd, ins []string
		privs := []struct{ col, priv string }{{c.TargetKey, "SELECT"}, {c.Column, "SELECT"}, {c.Column, "UPDATE"}}
		if c.CreateMissing {
			for _, col := range append([]string{c.TargetKey, c.Column}, slices.Sorted(maps.Keys(c.Defaults))...) {
				privs = append(privs, struct{ col, priv string }{col, "INSERT"})
			}
		}
		for _, pc := range privs {
			if _, found := tgt.Columns[pc.col]; !found {
				continue
			}
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT has_column_privilege($1::oid, $2::text, $3::text)", tgt.OID, pc.col, pc.priv).Scan(&ok); err != nil {
				return nil, fmt.Errorf("read privileges on %s: %w", tgt.Ident(), err)
			}
			if ok {
				continue
			}
			switch pc.priv {
			case "SELECT":
				sel = append(sel, pgx.Identifier{pc.col}.Sanitize())
			case "INSERT":
				ins = append(ins, pgx.Identifier{pc.col}.Sanitize())
			default:
				upd = append(upd, pgx.Identifier{pc.col}.Sanitize())
			}
		}
		if len(sel)+len(upd)+len(ins) > 0 {
			add(tgt, sel, upd, ins)
		}
	}
	var out []string
	for _, name := range order {
		n := wants[name]
		if _, whole := srcOID[name]; whole {
			out = append(out, fmt.Sprintf("GRANT SELECT ON %s TO %s", name, role))
		}
		var privs []string
		if len(n.sel) > 0 {
			privs = append(privs, fmt.Sprintf("SELECT (%s)", strings.Join(n.sel, ", ")))
		}
		if len(n.upd) > 0 {
			privs = append(privs, fmt.Sprintf("UPDATE (%s)", strings.Join(n.upd, ", ")))
		}
		if len(n.ins) > 0 {
			privs = append(privs, fmt.Sprintf("INSERT (%s)", strings.Join(n.ins, ", ")))
		}
		if len(privs) > 0 {
			out = append(out, fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(privs, ", "), name, role))
		}
	}
	return out, nil
}

// existing returns the counters whose source exists (fixIdentity refuses a
// missing one; the publication group says it is missing).
func existing(counters []counter.Counter, tables map[string]*counter.Table) []counter.Counter {
	var out []counter.Counter
	for _, c := range counters {
		if t, ok := tables[c.Source]; ok && t.Exists {
			out = append(out, c)
		}
	}
	return out
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
