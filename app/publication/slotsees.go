package publication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/state"
)

// Querier reads one row; *pgx.Conn, *pgxpool.Pool and pgx.Tx fit.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SlotView says whether walcount may stream from an existing slot with its
// publication.
type SlotView struct {
	// Stale is true when the slot must not be adopted: Why says why.
	Stale bool
	Why   string
	// Mark, when the slot is fit, is what setup records for it
	// (state.SetPublicationMark): the publication's oid and a position at
	// which the slot's catalog view already had it.
	Mark state.PublicationMark
}

// SlotSees tells whether the existing slot named slot (on the server of
// slotDB) may be adopted by walcount with publication pub (on the server
// of db, the primary). It may not when walcount's state has no checkpoint
// for it (its position is nobody's: a slot left by an earlier install, or
// made by hand), or when it may decode changes made before the
// publication existed.
//
// pgoutput looks the publication up in the catalog as of each decoded
// transaction (the historic snapshot of logical decoding), not as of now:
// a slot whose position predates the publication finds no publication
// for the first change it decodes, and PostgreSQL before 18 fails the
// stream, at every retry, with `publication "…" does not exist` (18 skips
// the publication with a warning until it appears, and so drops those
// changes). Two tests, in order:
//
//   - setup records, for each slot it creates or adopts, the publication's
//     oid and a WAL position at which it existed (state.PublicationMark):
//     with the same oid, the slot is stale when its confirmed_flush_lsn is
//     before that position;
//   - without a record (state written by an older walcount) or when the
//     publication was made again since (another oid), pgoutput itself is
//     asked, before PostgreSQL 18: a peek at the first change the slot would send
//     (pg_logical_slot_peek_binary_changes, which moves nothing) fails
//     as the stream would. On 18, which sends nothing instead of failing,
//     or when the peek cannot run, the slot is fit only
//     when the transaction that wrote the publication's catalog row is
//     older than the slot's catalog_xmin: every snapshot the slot still
//     decodes with sees it. A publication written since catalog_xmin
//     cannot be proven visible, and the slot counts as stale; recreating
//     it costs a reconciliation, never a count.
func SlotSees(ctx context.Context, db state.Querier, slotDB Querier, slot, pub string) (SlotView, error) {
	known, err := state.HasCheckpoint(ctx, db, slot)
	if err != nil {
		return SlotView{}, err
	}
	if !known {
		return SlotView{Stale: true, Why: fmt.Sprintf("walcount's state has no checkpoint for replication slot %s: it was left by an earlier install (a teardown that could not reach it) or made by hand, so its position is not walcount's and may predate publication %s", slot, pub)}, nil
	}
	var (
		confirmed   state.LSN
		confText    *string
		catalogXmin *int64
		versionNum  int
	)
	err = slotDB.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, catalog_xmin::text::bigint, current_setting('server_version_num')::int
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&confText, &catalogXmin, &versionNum)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotView{}, nil // no slot: nothing to adopt
	}
	if err != nil {
		return SlotView{}, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	if confText == nil || catalogXmin == nil {
		return SlotView{}, nil // lost, or not logical: reported as such
	}
	if err := confirmed.Scan(*confText); err != nil {
		return SlotView{}, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	var (
		oid        uint32
		xmin, next int64
	)
	err = db.QueryRow(ctx, `SELECT oid, xmin::text::bigint, (pg_snapshot_xmax(pg_current_snapshot())::text::bigint % 4294967296)
FROM pg_publication WHERE pubname = $1`, pub).Scan(&oid, &xmin, &next)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotView{}, nil // no publication: reported as such, setup creates it
	}
	if err != nil {
		return SlotView{}, fmt.Errorf("read publication %s: %w", pub, err)
	}
	if v, err := state.ReadVersion(ctx, db); err == nil && v < state.Version {
		// State written by an older walcount, which streamed from this
		// slot with this publication (its checkpoint says so: the
		// stream would have failed at every start otherwise). The
		// migration to version 6 records the same mark ('0/0'); without
		// it, the catalog test below could refuse a slot that works
		// (any transaction open when the slot was made).
		return SlotView{Mark: state.PublicationMark{OID: oid}}, nil
	}
	if state.CheckVersion(ctx, db) == nil {
		mark, ok, err := state.ReadPublicationMark(ctx, db, slot)
		if err != nil {
			return SlotView{}, err
		}
		if ok && mark.OID == oid {
			if confirmed < mark.LSN {
				return SlotView{Stale: true, Why: fmt.Sprintf("replication slot %s is confirmed up to %s, before %s where publication %s began: it would decode changes made before the publication, which PostgreSQL before 18 refuses for good (\"publication does not exist\")", slot, confirmed, mark.LSN, pub)}, nil
			}
			return SlotView{Mark: mark}, nil
		}
	}
	// No mark to go by: before 18, ask pgoutput itself, on the first
	// change the slot would send now (a peek moves nothing). It fails as
	// the stream would; it cannot run while a walsender holds the slot,
	// whose stream then says it (ErrPublicationMissing in package cdc).
	// 18 does not fail: it skips the publication it cannot see, so that
	// the changes before it are not sent at all, and only the catalog
	// test below tells.
	err = errors.New("PostgreSQL 18 skips a publication it cannot see yet")
	if versionNum < 180000 {
		var n int64
		err = slotDB.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, 1, 'proto_version', '1', 'publication_names', $2)`, slot, pub).Scan(&n)
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil && versionNum >= 150000:
		return SlotView{Mark: state.PublicationMark{OID: oid, LSN: confirmed}}, nil
	case err == nil:
		// 14 sends a BEGIN and COMMIT for a transaction without a
		// change too: the peek may have stopped at one, before any
		// change it would fail on. The catalog test decides.
	case errors.As(err, &pgErr) && pgErr.Code == "42704" && strings.Contains(pgErr.Message, "publication"):
		return SlotView{Stale: true, Why: fmt.Sprintf("replication slot %s would decode changes made before publication %s existed: PostgreSQL answers %q, and would at every start of the stream", slot, pub, pgErr.Message)}, nil
	case errors.As(err, &pgErr) && pgErr.Code == "55006": // object_in_use: a walcount streams from it
		return SlotView{}, nil
	}
	// No peek (18, or no privilege): the catalog says what it can.
	if writtenSince(uint32(xmin), uint32(*catalogXmin), uint32(next)) {
		return SlotView{Stale: true, Why: fmt.Sprintf("publication %s was created or changed after the oldest catalog state replication slot %s still decodes with (its catalog_xmin %d, the publication's xmin %d): the slot may decode changes made before the publication, which PostgreSQL before 18 refuses for good (\"publication does not exist\")", pub, slot, *catalogXmin, xmin)}, nil
	}
	return SlotView{Mark: state.PublicationMark{OID: oid, LSN: confirmed}}, nil
}

// writtenSince reports whether xid x lies in [from, next): assigned at or
// after from, which is at most 2^31 transactions behind next (a slot's
// catalog_xmin holds freezing back). Xids are compared modulo 2^32, as
// PostgreSQL does; the special xids below 3 (frozen, bootstrap) are never
// in it.
func writtenSince(x, from, next uint32) bool {
	if x < 3 {
		return false
	}
	return x-from < next-from
}
