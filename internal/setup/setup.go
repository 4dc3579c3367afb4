// Package setup creates and removes what walcount needs in PostgreSQL and
// Redis: the publication of the source tables, the logical replication
// slot (pgoutput), and the state schema with its checkpoint table.
//
// See https://www.postgresql.org/docs/15/logical-replication-publication.html
// and https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-REPLICATION.
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
	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// ErrNoLogicalReplication means the server's wal_level is not logical.
var ErrNoLogicalReplication = errors.New("the database cannot do logical replication")

// Options configure Setup.
type Options struct {
	Slot        string
	Publication string
	Counters    []counter.Counter
	// RecreateSlot drops an existing slot and creates it anew; the
	// checkpoint moves to the new slot's start and a full reconcile is
	// needed afterwards.
	RecreateSlot bool
	// FixReplicaIdentity sets REPLICA IDENTITY FULL on sources whose
	// identity does not carry the counters' columns.
	FixReplicaIdentity bool
	// PrintSQL writes the statements to Out instead of running them.
	PrintSQL bool
	Out      io.Writer
	Logger   *zap.Logger
}

// Result says what Setup did.
type Result struct {
	CreatedSlot        bool
	CheckpointLSN      string
	NeedsReconcile     bool
	Statements         []string
	FixedIdentityTable []string
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
	var res Result
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return res, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" && !opt.PrintSQL {
		return res, fmt.Errorf("%w: wal_level is %q; run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL",
			ErrNoLogicalReplication, walLevel)
	}
	exec := func(sql string, args ...any) error {
		if opt.PrintSQL {
			stmt := sql
			for i, a := range args {
				stmt = strings.ReplaceAll(stmt, fmt.Sprintf("$%d", i+1), quoteLiteral(fmt.Sprint(a)))
			}
			res.Statements = append(res.Statements, stmt)
			if opt.Out != nil {
				fmt.Fprintf(opt.Out, "%s;\n", stmt)
			}
			return nil
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", firstLine(sql), err)
		}
		return nil
	}

	// The state schema, created or migrated forward to this walcount's
	// version in one transaction.
	if opt.PrintSQL {
		from, err := state.ReadVersion(ctx, conn)
		if errors.Is(err, state.ErrNotSetUp) {
			from, err = 0, nil
		}
		if err != nil {
			return res, err
		}
		if from < state.Version {
			for _, stmt := range state.MigrationSQL(from) {
				_ = exec(stmt)
			}
		}
	} else if _, _, err := state.Migrate(ctx, conn); err != nil {
		return res, err
	}

	if opt.FixReplicaIdentity {
		fixed, err := fixIdentity(ctx, conn, opt.Counters, exec)
		if err != nil {
			return res, err
		}
		res.FixedIdentityTable = fixed
	}

	// The publication lists exactly the counters' source tables.
	sources := Sources(opt.Counters)
	pub := pgx.Identifier{opt.Publication}.Sanitize()
	var pubExists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", opt.Publication).Scan(&pubExists); err != nil {
		return res, fmt.Errorf("read publication: %w", err)
	}
	if pubExists {
		if err := exec(fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s", pub, strings.Join(sources, ", "))); err != nil {
			return res, err
		}
	} else if err := exec(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pub, strings.Join(sources, ", "))); err != nil {
		return res, err
	}

	// The slot, and the checkpoint that starts at its consistent point.
	var slotExists bool
	var plugin string
	err := conn.QueryRow(ctx, "SELECT true, plugin FROM pg_replication_slots WHERE slot_name = $1", opt.Slot).Scan(&slotExists, &plugin)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return res, fmt.Errorf("read replication slot: %w", err)
	}
	if slotExists && plugin != "pgoutput" && !opt.RecreateSlot {
		return res, fmt.Errorf("replication slot %q uses plugin %q, not pgoutput; run walcount setup --recreate-slot", opt.Slot, plugin)
	}
	hadCheckpoint, err := state.HasCheckpoint(ctx, conn, opt.Slot)
	if err != nil {
		return res, err
	}
	if slotExists && opt.RecreateSlot {
		if err := exec("SELECT pg_drop_replication_slot($1)", opt.Slot); err != nil {
			return res, err
		}
		slotExists = false
	}
	if !slotExists {
		if opt.PrintSQL {
			_ = exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", opt.Slot)
			_ = exec(state.InitCheckpointFromSlotSQL, opt.Slot)
			return res, nil
		}
		var lsn state.LSN
		if err := conn.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", opt.Slot).Scan(&lsn); err != nil {
			return res, fmt.Errorf("create replication slot %q: %w", opt.Slot, err)
		}
		res.CreatedSlot = true
		// A new slot starts a new history: whatever the counters missed
		// before it (or since an old slot was lost) needs a reconcile.
		res.NeedsReconcile = hadCheckpoint
		if _, err := state.InitCheckpoint(ctx, conn, opt.Slot, lsn, true); err != nil {
			return res, err
		}
		res.CheckpointLSN = lsn.String()
		return res, nil
	}
	if opt.PrintSQL {
		return res, nil
	}
	// The slot exists: keep the checkpoint, or start one at the slot's
	// confirmed position when it is missing.
	var confirmed state.LSN
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", opt.Slot).Scan(&confirmed); err != nil {
		return res, fmt.Errorf("read replication slot %q: %w", opt.Slot, err)
	}
	w, err := state.InitCheckpoint(ctx, conn, opt.Slot, confirmed, false)
	if err != nil {
		return res, err
	}
	res.CheckpointLSN = w.String()
	return res, nil
}

// fixIdentity sets REPLICA IDENTITY FULL on each source whose identity
// does not carry every column a counter reads.
func fixIdentity(ctx context.Context, conn *pgx.Conn, counters []counter.Counter, exec func(string, ...any) error) ([]string, error) {
	need := map[string][]string{}
	for _, c := range counters {
		s, t := c.SourceTable()
		src := pgx.Identifier{s, t}.Sanitize()
		need[src] = append(need[src], c.ReadColumns()...)
	}
	var fixed []string
	for _, src := range slices.Sorted(maps.Keys(need)) {
		var ident string
		var missing bool
		err := conn.QueryRow(ctx, `
SELECT c.relreplident::text,
       EXISTS (SELECT 1 FROM unnest($2::text[]) AS n(name)
               WHERE NOT EXISTS (
                 SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                 WHERE i.indrelid = c.oid AND a.attname = n.name
                   AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))))
FROM pg_class c WHERE c.oid = to_regclass($1)`, src, need[src]).Scan(&ident, &missing)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("source table %s does not exist", src)
		}
		if err != nil {
			return nil, fmt.Errorf("read replica identity of %s: %w", src, err)
		}
		if ident == "f" || !missing {
			continue
		}
		if err := exec(fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL", src)); err != nil {
			return nil, err
		}
		fixed = append(fixed, src)
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
