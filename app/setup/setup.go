// Package setup creates and removes what walcount needs in PostgreSQL and
// Redis: the publication of the source and target tables, the logical
// replication slot (pgoutput), walcount's state schema, and the claim on
// each counter column.
//
// Setup first runs the same preflight checks as walcount check and run,
// through the same gate, and refuses where run would refuse, except for
// what setup itself creates (CauseSetup findings) and, when asked, the
// replica identity it fixes. Then it creates everything it can in one
// transaction (the state schema, the identity fixes, the publication, the
// column claims), and the slot last, since PostgreSQL does not create a
// logical slot in a transaction that has written anything.
//
// See https://www.postgresql.org/docs/current/logical-replication-publication.html
// and https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-REPLICATION.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes every package outside internal/ so.
package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/publication"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/pgversion"
	"github.com/walcount/walcount/internal/redact"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// ErrNoLogicalReplication means the server's wal_level is not logical.
var ErrNoLogicalReplication = errors.New("the database cannot do logical replication")

// Options configure Setup.
type Options struct {
	// Config names the servers, the slot, the publication and the
	// counters, as walcount run will use them.
	Config config.Config
	// RecreateSlot drops an existing slot and creates it anew; the
	// checkpoint moves to the new slot's start and every counter is
	// marked dirty, to be reconciled.
	RecreateSlot bool
	// FixReplicaIdentity sets REPLICA IDENTITY FULL on sources whose
	// identity does not carry the counters' columns.
	FixReplicaIdentity bool
	// SlotConn, when set, creates and drops the slot: a connection to
	// replication_url, when database_url goes through a pooler. nil means
	// the connection setup runs on.
	SlotConn *pgx.Conn
	// PrintSQL writes the statements to Out instead of running them.
	PrintSQL bool
	Out      io.Writer
	Logger   *zap.Logger
	// Waits, when set, is told what the creation of the slot waits for
	// while it waits (see watchSlotCreation): walcount setup prints it on
	// stderr.
	Waits io.Writer
}

// Result says what Setup did.
type Result struct {
	CreatedSlot        bool
	CheckpointLSN      string
	NeedsReconcile     bool
	Statements         []string
	FixedIdentityTable []string
	// Published lists the publication's tables, with their column lists.
	Published []string
	// Warnings are the preflight warnings, for the operator.
	Warnings []preflight.Finding
	// StaleSlot, when set, says why the existing slot was not adopted
	// but dropped and created anew (see publication.SlotSees).
	StaleSlot string
	// DroppedVia lists the via tables of counters no longer configured
	// that setup dropped (or, printing, printed the DROP of).
	DroppedVia []string
}

// Sources returns the distinct source tables of the counters, sorted, as
// quoted qualified names.
func Sources(counters []counter.Counter) []string {
	var out []string
	for _, c := range counters {
		s, t := c.SourceTable()
		q := pgx.Identifier{s, t}.Sanitize()
		if !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out
}

// Run makes the database ready for walcount run. It is idempotent.
func Run(ctx context.Context, conn *pgx.Conn, opt Options) (Result, error) {
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	cfg := opt.Config
	cfg.Counters = slices.Clone(cfg.Counters)
	if len(cfg.Counters) == 0 {
		cfg.Counters = []counter.Counter{counter.Default()}
	}
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	var res Result
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return res, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" && !opt.PrintSQL {
		return res, fmt.Errorf("%w: wal_level is %q; run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL",
			ErrNoLogicalReplication, walLevel)
	}
	version, err := pgversion.Read(ctx, conn)
	if err != nil {
		return res, err
	}
	if !opt.PrintSQL {
		if res.Warnings, err = gate(ctx, cfg, opt); err != nil {
			return res, err
		}
	}

	if opt.PrintSQL {
		return res, printSQL(ctx, conn, cfg, version, opt, &res)
	}
	s := &statements{conn: conn, out: opt.Out, res: &res}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		s.tx = tx
		return s.prepare(ctx, cfg, version, opt)
	})
	s.tx = nil
	if err != nil {
		return res, err
	}
	if s.ownerNeeded != nil {
		return res, s.ownerNeeded
	}
	return res, s.slot(ctx, cfg, version, opt)
}

// gate runs the preflight checks and refuses what setup cannot fix: every
// Problem but those setup creates, and the replica identity when asked to
// fix it.
func gate(ctx context.Context, cfg config.Config, opt Options) ([]preflight.Finding, error) {
	findings, err := preflight.Run(ctx, preflight.Options{Config: cfg, Logger: opt.Logger})
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	var blocking, warnings []preflight.Finding
	for _, f := range findings {
		switch {
		case f.Severity == preflight.Warning:
			warnings = append(warnings, f)
		case f.Severity != preflight.Problem, f.Cause == preflight.CauseSetup:
		case f.Check == preflight.CheckOtherWriters:
			// The app's own triggers go after setup and before run
			// (docs/cutover.md): setup says so, run refuses.
			warnings = append(warnings, f)
		case f.Check == preflight.CheckReplicaIdentity && opt.FixReplicaIdentity:
		case f.Check == preflight.CheckSlot && opt.RecreateSlot:
		case f.Check == preflight.CheckReplicaIdentity && strings.Contains(f.Fix, "REPLICA IDENTITY FULL"):
			// setup can run that fix itself when asked: say so, as a
			// plain likes table meets it on the very first setup.
			f.Fix += "; or run walcount setup --fix-replica-identity, which does it in setup's transaction"
			blocking = append(blocking, f)
		default:
			blocking = append(blocking, f)
		}
	}
	return warnings, preflight.Gate(blocking)
}

// statements runs (or, with print, only prints) what setup does.
type statements struct {
	conn  *pgx.Conn
	tx    pgx.Tx
	print bool
	out   io.Writer
	res   *Result
	// ownerNeeded is set when the publication needs the owner: setup
	// commits the rest and stops before the slot.
	ownerNeeded *OwnerNeededError
	// stateRole, when printing, is the owner of walcount's state schema:
	// the owner of the tables writes the state as that role.
	stateRole string
}

// recordIdentity records the replica identity a table has before setup
// sets it to FULL (state.RecordIdentitySQL). Printed, it runs as the
// owner of walcount's state, whose member the tables' owner is.
func (s *statements) recordIdentity(ctx context.Context, table, ident, index string) error {
	if s.print && s.stateRole != "" {
		_ = s.exec(ctx, "SET ROLE "+pgx.Identifier{s.stateRole}.Sanitize())
		defer func() { _ = s.exec(ctx, "RESET ROLE") }()
	}
	return s.exec(ctx, state.RecordIdentitySQL, table, ident, index)
}

func (s *statements) exec(ctx context.Context, sql string, args ...any) error {
	if s.print {
		stmt := sql
		for i, a := range args {
			stmt = strings.ReplaceAll(stmt, fmt.Sprintf("$%d", i+1), quoteLiteral(fmt.Sprint(a)))
		}
		s.res.Statements = append(s.res.Statements, stmt)
		if s.out != nil {
			fmt.Fprintf(s.out, "%s;\n", stmt)
		}
		return nil
	}
	var err error
	if s.tx != nil {
		_, err = s.tx.Exec(ctx, sql, args...)
	} else {
		_, err = s.conn.Exec(ctx, sql, args...)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", firstLine(sql), err)
	}
	return nil
}

// prepare is everything but the slot, in one transaction: the state
// schema, the identity fixes, the publication and the column claims.
func (s *statements) prepare(ctx context.Context, cfg config.Config, version pgversion.Version, opt Options) error {
	// The state schema, created or migrated forward to this walcount's
	// version.
	if s.print {
		from, err := state.ReadVersion(ctx, s.conn)
		if errors.Is(err, state.ErrNotSetUp) {
			from, err = 0, nil
		}
		if err != nil {
			return err
		}
		if from < state.Version {
			for _, stmt := range state.MigrationSQL(from) {
				_ = s.exec(ctx, stmt)
			}
		}
	} else if _, _, err := state.MigrateIn(ctx, s.tx); err != nil {
		return err
	}

	var q counter.Querier = s.conn
	if s.tx != nil {
		q = s.tx
	}
	// The via tables of the counters through a parent.
	vias, err := s.viaTables(ctx, q, cfg.Counters)
	if err != nil {
		return err
	}
	if err := s.dropRemovedVia(ctx, q, cfg.Slot, cfg.Counters); err != nil {
		return err
	}

	if opt.FixReplicaIdentity {
		fixed, err := s.fixIdentity(ctx, cfg.Counters)
		if err != nil {
			return err
		}
		s.res.FixedIdentityTable = fixed
	}

	// The publication holds the sources and, for their lifecycle, the
	// targets (see package publication).
	tables, unusable, err := publication.Layout(version, cfg.Counters, func(name string) (*counter.Table, error) {
		if s.print && name == cdc.MessageTable {
			// Printed above, not run.
			return publication.MessagesTable(), nil
		}
		schema, table := counter.SplitTable(name)
		t, err := counter.ReadTable(ctx, q, schema, table)
		if err == nil && !t.Exists && s.print && vias[name] {
			// Printed above, not run.
			t = &counter.Table{Schema: schema, Name: table, Exists: true, Kind: "r", ReplIdent: "f"}
		}
		return t, err
	})
	if err != nil {
		return err
	}
	if len(unusable) > 0 {
		// The preflight gate refused these already; never publish them.
		return fmt.Errorf("%s: walcount check says how to fix it", publication.Refusal(version, unusable[0]))
	}
	for _, t := range tables {
		s.res.Published = append(s.res.Published, t.SQL())
	}
	var pubExists bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&pubExists); err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	matches := false
	if pubExists {
		if matches, err = publication.Matches(ctx, q, version, cfg.Publication, tables); err != nil {
			return err
		}
	}
	if !matches && !s.print {
		// CREATE PUBLICATION needs the ownership of every table;
		// ALTER PUBLICATION that of the publication too. When walcount's
		// role lacks it, the state schema and the claims are still made
		// (the owner's SQL names walcount.messages), and the slot is not:
		// pgoutput could not decode the changes before the publication.
		missing, err := notOwned(ctx, q, publicationTables(tables))
		if err != nil {
			return err
		}
		if pubExists {
			owns, _, err := ownsPublication(ctx, q, cfg.Publication)
			if err != nil {
				return err
			}
			if !owns {
				missing = append([]string{"publication " + pgx.Identifier{cfg.Publication}.Sanitize()}, missing...)
			}
		}
		if len(missing) > 0 {
			user, err := currentUser(ctx, q)
			if err != nil {
				return err
			}
			step := "CREATE PUBLICATION " + pgx.Identifier{cfg.Publication}.Sanitize()
			if pubExists {
				step = "ALTER PUBLICATION " + pgx.Identifier{cfg.Publication}.Sanitize() + " (it does not hold exactly what walcount needs)"
			}
			s.ownerNeeded = &OwnerNeededError{Step: step, Owned: missing, Role: user, Hint: ownerHint}
			matches = true // nothing to run here
		}
	}
	switch {
	case matches:
		// Never altered: that needs the owner of every table in it.
	case pubExists:
		for _, stmt := range publication.Alter(version, cfg.Publication, tables) {
			if err := s.exec(ctx, stmt); err != nil {
				return err
			}
		}
	default:
		if err := s.exec(ctx, publication.Create(version, cfg.Publication, tables)); err != nil {
			return err
		}
	}

	// One slot keeps each counter column (design rule 15).
	if !s.print {
		if err := state.Claim(ctx, s.tx, cfg.Slot, cfg.Counters); err != nil {
			return err
		}
	}
	return nil
}

// viaTables creates the via table of each counter through a parent
// (counter.ViaTableSQL), or leaves it as it is, gives every parent row a
// via row of zeros (counter.ViaSeedSQL), and returns their names.
// A parent key or counter column that does not exist creates none: the
// preflight gate has refused that configuration already.
func (s *statements) viaTables(ctx context.Context, q counter.Querier, counters []counter.Counter) (map[string]bool, error) {
	vias := map[string]bool{}
	lookup := func(name string) (*counter.Table, error) {
		schema, table := counter.SplitTable(name)
		return counter.ReadTable(ctx, q, schema, table)
	}
	for _, c := range counters {
		stmts, err := viaTableStatements(c, lookup)
		if err != nil {
			return nil, err
		}
		for _, stmt := range stmts {
			if err := s.exec(ctx, stmt); err != nil {
				return nil, err
			}
		}
		if stmts != nil {
			vias[counter.ViaTable(c.Through.Counter)] = true
		}
	}
	return vias, nil
}

// viaTableStatements returns the statements that create the via table of
// c, a counter through a parent, and give every parent row a via row of
// zeros (so that the first flushes find them; a backfill seeds again, for
// the parents inserted since, and counts them). None for any other
// counter, or when the parent key or the counter column does not exist:
// the preflight gate has refused that configuration already.
func viaTableStatements(c counter.Counter, lookup func(name string) (*counter.Table, error)) ([]string, error) {
	if c.Through == nil || c.IsVia() {
		return nil, nil
	}
	parent, err := lookup(c.Through.Table)
	if err != nil {
		return nil, err
	}
	target, err := lookup(c.Target)
	if err != nil {
		return nil, err
	}
	key, okKey := parent.Columns[c.Through.Key]
	col, okCol := target.Columns[c.Column]
	if !okKey || !okCol {
		return nil, nil
	}
	ext, _ := c.Extremum()
	return append(counter.ViaTableSQL(c.Through.Counter, key, col, ext != ""), counter.ViaSeedSQL(c)), nil
}

// dropRemovedVia drops the via tables of the counters through a parent
// that slot kept (walcount.owners names their columns) and that are no
// longer configured: nothing reads them any more, and a counter of that
// name added back gets a new one, seeded and backfilled. DROP TABLE takes
// the table out of the publication too.
func (s *statements) dropRemovedVia(ctx context.Context, q counter.Querier, slot string, counters []counter.Counter) error {
	configured := map[string]bool{}
	for _, c := range counters {
		if c.Through != nil {
			configured[counter.ViaTable(c.Through.Counter)] = true
		}
	}
	var kept bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('walcount.owners') IS NOT NULL`).Scan(&kept); err != nil {
		return fmt.Errorf("read the via tables of slot %s: %w", slot, err)
	}
	if !kept {
		return nil // no state schema yet (printed): nothing was kept
	}
	rows, err := q.Query(ctx, `SELECT DISTINCT target_table FROM walcount.owners
WHERE slot_name = $1 AND target_table LIKE $2 AND to_regclass(target_table) IS NOT NULL ORDER BY 1`, slot, counter.ViaSchema+".via\\_%")
	var tables []string
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("read the via tables of slot %s: %w", slot, err)
	}
	for _, table := range tables {
		if configured[table] {
			continue
		}
		schema, name := counter.SplitTable(table)
		if err := s.exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{schema, name}.Sanitize()); err != nil {
			return fmt.Errorf("drop the via table of a counter removed from the configuration (walcount setup --print-sql prints it for the table's owner): %w", err)
		}
		s.res.DroppedVia = append(s.res.DroppedVia, table)
	}
	return nil
}

// slot creates the slot (last: PostgreSQL creates a logical slot only in a
// transaction that has written nothing) and the checkpoint that starts at
// its consistent point, or keeps both when they exist.
func (s *statements) slot(ctx context.Context, cfg config.Config, version pgversion.Version, opt Options) error {
	// The slot lives where the stream reads it: replication_url's server
	// (a hot standby that decodes, or a pooler's direct connection).
	slotConn := s.conn
	if opt.SlotConn != nil {
		slotConn = opt.SlotConn
	} else if cfg.SeparateSlotServer() && !s.print {
		c, err := cfg.ConnectSlotSQL(ctx)
		if err != nil {
			return fmt.Errorf("connect to the replication URL %s: %s", redact.URL(cfg.ReplicationURL), redact.URL(err.Error()))
		}
		defer c.Close(context.WithoutCancel(ctx))
		slotConn = c
	}
	plugin, slotExists, err := slot.Plugin(ctx, slotConn, cfg.Slot)
	if err != nil {
		return fmt.Errorf("read replication slot: %w", err)
	}
	if slotExists && plugin != "pgoutput" && !opt.RecreateSlot {
		return fmt.Errorf("replication slot %q uses plugin %q, not pgoutput; run walcount setup --recreate-slot", cfg.Slot, plugin)
	}
	hadCheckpoint := false
	if !s.print {
		if hadCheckpoint, err = state.HasCheckpoint(ctx, s.conn, cfg.Slot); err != nil {
			return err
		}
	}
	// A slot walcount's state does not know, or one that would decode
	// changes made before the publication, is never adopted: it is made
	// anew, and every counter repaired.
	var mark state.PublicationMark
	if slotExists && !opt.RecreateSlot && !s.print {
		view, err := publication.SlotSees(ctx, s.conn, slotConn, cfg.Slot, cfg.Publication)
		if err != nil {
			return err
		}
		s.res.StaleSlot, mark = view.Why, view.Mark
	}
	if slotExists && (opt.RecreateSlot || s.res.StaleSlot != "") {
		if err := slot.Drop(ctx, slotConn, cfg.Slot); err != nil {
			if s.res.StaleSlot != "" {
				return fmt.Errorf("drop replication slot %q, which walcount must not adopt (%s; stop what streams from it first): %w", cfg.Slot, s.res.StaleSlot, err)
			}
			return fmt.Errorf("drop replication slot %q: %w", cfg.Slot, err)
		}
		slotExists = false
	}
	if !slotExists {
		if s.print {
			_ = s.exec(ctx, slot.CreateSQL(version), cfg.Slot)
			_ = s.exec(ctx, slot.InitCheckpointSQL, cfg.Slot)
			return nil
		}
		// A position at which the publication exists, taken before the
		// slot: the slot's consistent point is past it, which the
		// publication mark records for later setups and checks.
		pubMark, err := markBefore(ctx, s.conn, slotConn, cfg.Publication)
		if err != nil {
			return err
		}
		stopWatch := watchSlotCreation(ctx, cfg.DatabaseURL, cfg.Slot, slotConn.PgConn().PID(), opt.Waits)
		// The primary is asked for snapshots on its own connection, never
		// on the one that creates the slot.
		var primary slot.Execer
		if slotConn != s.conn {
			primary = s.conn
		}
		var lsn state.LSN
		err = slot.Create(ctx, slotConn, primary, cfg.Slot, &lsn)
		stopWatch()
		if err != nil {
			return fmt.Errorf("create replication slot %q: %w", cfg.Slot, err)
		}
		s.res.CreatedSlot = true
		// A new slot starts a new history: whatever the counters missed
		// before it (or since an old slot was lost) must be reconciled,
		// and so must what a stale slot's counts may hold.
		s.res.NeedsReconcile = hadCheckpoint || s.res.StaleSlot != ""
		err = pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
			if _, err := state.InitCheckpoint(ctx, tx, cfg.Slot, lsn, true); err != nil {
				return err
			}
			if err := state.SetPublication(ctx, tx, cfg.Slot, cfg.Publication); err != nil {
				return err
			}
			if pubMark.OID != 0 {
				if err := state.SetPublicationMark(ctx, tx, cfg.Slot, pubMark); err != nil {
					return err
				}
			}
			if !s.res.NeedsReconcile {
				return nil
			}
			for _, c := range cfg.Counters {
				if err := state.MarkDirty(ctx, tx, cfg.Slot, c.Name, nil, "the replication slot was recreated: changes made before it were not seen"); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.res.CheckpointLSN = lsn.String()
		return nil
	}
	if s.print {
		return nil
	}
	// The slot exists: keep the checkpoint, or start one at the slot's
	// confirmed position when it is missing.
	var confirmed state.LSN
	if err := slot.ConfirmedFlush(ctx, slotConn, cfg.Slot, &confirmed); err != nil {
		return err
	}
	w, err := state.InitCheckpoint(ctx, s.conn, cfg.Slot, confirmed, false)
	if err != nil {
		return err
	}
	if err := state.SetPublication(ctx, s.conn, cfg.Slot, cfg.Publication); err != nil {
		return err
	}
	if mark.OID != 0 {
		if err := state.SetPublicationMark(ctx, s.conn, cfg.Slot, mark); err != nil {
			return err
		}
	}
	s.res.CheckpointLSN = w.String()
	return nil
}

// markBefore returns the publication's oid and the primary's WAL insert
// position, past the publication's creation, and, when the slot is made
// on a hot standby, waits for the standby to replay that far: a slot
// whose consistent point came before would decode changes made before the
// publication (see publication.SlotSees). A zero mark means no
// publication exists to mark.
func markBefore(ctx context.Context, primary, slotConn *pgx.Conn, pub string) (state.PublicationMark, error) {
	var m state.PublicationMark
	var lsn string
	err := primary.QueryRow(ctx, `SELECT oid, pg_current_wal_insert_lsn()::text FROM pg_publication WHERE pubname = $1`, pub).Scan(&m.OID, &lsn)
	if errors.Is(err, pgx.ErrNoRows) {
		return state.PublicationMark{}, nil
	}
	if err == nil {
		err = m.LSN.Scan(lsn)
	}
	if err != nil {
		return m, fmt.Errorf("read publication %s: %w", pub, err)
	}
	if slotConn == primary {
		return m, nil
	}
	for {
		var standby, replayed bool
		if err := slotConn.QueryRow(ctx, `SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)`, m.LSN.String()).Scan(&standby, &replayed); err != nil {
			return m, fmt.Errorf("read the replay position of the slot's server: %w", err)
		}
		if !standby || replayed {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return m, fmt.Errorf("wait for the standby to replay the publication (%s): %w", m.LSN, ctx.Err())
		case <-time.After(100 * time.Millisecond): // polled: PostgreSQL signals no replay progress to a client
		}
	}
}

// fixIdentity sets REPLICA IDENTITY FULL on each source whose identity
// does not carry every column a counter reads.
func (s *statements) fixIdentity(ctx context.Context, counters []counter.Counter) ([]string, error) {
	need := map[string][]string{}
	for _, c := range counters {
		if c.AppendOnly {
			continue // takes no updates or deletes to attribute
		}
		sc, t := c.SourceTable()
		src := pgx.Identifier{sc, t}.Sanitize()
		need[src] = append(need[src], c.ReadColumns()...)
	}
	var q counter.Querier = s.conn
	if s.tx != nil {
		q = s.tx
	}
	var fixed, notOwned []string
	for _, src := range slices.Sorted(maps.Keys(need)) {
		// A partitioned table's changes are decoded per partition, with
		// each partition's own identity: fix the leaves too.
		rows, err := q.Query(ctx, `
SELECT n.nspname::text, c.relname::text, c.relreplident::text,
       EXISTS (SELECT 1 FROM unnest($2::text[]) AS w(name)
               WHERE NOT EXISTS (
                 SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                 WHERE i.indrelid = c.oid AND a.attname = w.name
                   AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident)))),
       pg_has_role(current_user, c.relowner, 'USAGE'),
       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attgenerated = 'v' AND NOT a.attisdropped),
       coalesce((SELECT ic.relname::text FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
                 WHERE i.indrelid = c.oid AND i.indisreplident), '')
FROM (SELECT to_regclass($1) AS relid, 0 AS level
      UNION ALL
      SELECT relid, level FROM pg_partition_tree(to_regclass($1)) WHERE isleaf AND level > 0) p
JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY p.level, 1`, src, need[src])
		if err != nil {
			return nil, fmt.Errorf("read replica identity of %s: %w", src, err)
		}
		type rel struct {
			name, ident string
			index       string
			missing     bool
			owned       bool
			virtual     bool
		}
		rels, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (rel, error) {
			var r rel
			var schema, table string
			err := row.Scan(&schema, &table, &r.ident, &r.missing, &r.owned, &r.virtual, &r.index)
			r.name = pgx.Identifier{schema, table}.Sanitize()
			return r, err
		})
		if err != nil {
			return nil, fmt.Errorf("read replica identity of %s: %w", src, err)
		}
		if len(rels) == 0 {
			return nil, fmt.Errorf("source table %s does not exist", src)
		}
		changed := false
		for _, r := range rels {
			if r.ident == "f" || !r.missing {
				continue
			}
			if r.virtual {
				// FULL would hold the VIRTUAL generated column, which no
				// publication carries: PostgreSQL 18 would then refuse
				// every UPDATE and DELETE of the table.
				return nil, fmt.Errorf("cannot set REPLICA IDENTITY FULL on %s: it has a VIRTUAL generated column, and PostgreSQL refuses every UPDATE and DELETE of a published table whose identity holds one; give it a primary key (or a unique index used as REPLICA IDENTITY USING INDEX) holding %s, or make the column STORED",
					r.name, strings.Join(need[src], ", "))
			}
			if !r.owned && !s.print {
				notOwned = append(notOwned, r.name)
				continue
			}
			// The identity it had, for walcount teardown to restore.
			if err := s.recordIdentity(ctx, r.name, r.ident, r.index); err != nil {
				return nil, err
			}
			if err := s.exec(ctx, fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL", r.name)); err != nil {
				return nil, err
			}
			changed = true
		}
		if changed {
			fixed = append(fixed, src)
		}
	}
	if len(notOwned) > 0 {
		user, err := currentUser(ctx, q)
		if err != nil {
			return nil, err
		}
		return nil, &OwnerNeededError{Step: "ALTER TABLE … REPLICA IDENTITY FULL", Owned: notOwned, Role: user,
			Hint: "run walcount setup --print-sql --fix-replica-identity (with walcount's configuration) and have the owner run its output once with psql -v ON_ERROR_STOP=1 -f, then run walcount setup again"}
	}
	return fixed, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
