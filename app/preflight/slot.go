package preflight

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/publication"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// lookupSlot reads the slot into r.slot (nil when it does not exist).
func (r *run) lookupSlot() error {
	i, err := slot.ReadInfo(r.ctx, r.slotConn, r.version, r.cfg.Slot)
	if err != nil {
		return r.queryFailed(CheckSlot, "slot "+r.cfg.Slot, err)
	}
	r.slot = i
	return nil
}

// checkSlot checks design rule 12 ahead of time: the slot must exist,
// decode with pgoutput in this database, and still hold its WAL.
func (r *run) checkSlot() error {
	s := r.slot
	name := r.cfg.Slot
	recreate := "walcount setup --recreate-slot (walcount run then repairs every counter by itself)"
	// With on_slot_loss: recreate, a slot that walcount had (its
	// checkpoint is there) and lost is what run repairs by itself, at
	// start as while running: a restart after a failover to a server
	// without the slot must not wait for an operator.
	selfRepair := r.cfg.OnSlotLoss == config.SlotLossRecreate && r.hasCheckpoint()
	const repairs = "on_slot_loss is recreate: walcount run creates it anew, marks every counter dirty and repairs it"
	switch {
	case s == nil && selfRepair:
		r.warn(CheckSlot, fmt.Sprintf("replication slot %s does not exist (dropped, or this server was promoted without it); %s", name, repairs),
			"nothing, or walcount setup --recreate-slot to do it now")
		return nil
	case s == nil:
		r.setupProblem(CheckSlot, fmt.Sprintf("replication slot %s does not exist", name), "walcount setup")
		return nil
	case s.Type != "logical":
		r.problem(CheckSlot, fmt.Sprintf("replication slot %s is a %s slot, not a logical one", name, s.Type),
			"choose another --slot, or drop this one if nothing uses it and run walcount setup")
		return nil
	case s.Database == nil || *s.Database != r.database:
		db := "<none>"
		if s.Database != nil {
			db = *s.Database
		}
		r.problem(CheckSlot, fmt.Sprintf("replication slot %s belongs to database %s, not %s", name, db, r.database),
			"choose another --slot, or point --database-url at database "+db)
		return nil
	case s.Plugin != "pgoutput":
		r.problem(CheckSlot, fmt.Sprintf("replication slot %s uses plugin %s, not pgoutput", name, s.Plugin), recreate)
		return nil
	case (s.WALStatus != nil && *s.WALStatus == "lost" || s.RestartLSN == nil) && selfRepair:
		r.warn(CheckSlot, fmt.Sprintf("replication slot %s is lost: the WAL it needs was removed; %s", name, repairs),
			"nothing, or walcount setup --recreate-slot to do it now")
		return nil
	case s.WALStatus != nil && *s.WALStatus == "lost" || s.RestartLSN == nil:
		r.problem(CheckSlot,
			fmt.Sprintf("replication slot %s is lost: the WAL it needs was removed, so changes since its position are gone", name),
			recreate)
		return nil
	case s.WALStatus != nil && *s.WALStatus == "unreserved":
		r.warn(CheckSlot,
			fmt.Sprintf("replication slot %s is unreserved: it is past max_slot_wal_keep_size and will be lost at the next checkpoint unless walcount catches up at once", name),
			"start walcount now, or raise max_slot_wal_keep_size: ALTER SYSTEM SET max_slot_wal_keep_size = '100GB'; SELECT pg_reload_conf();")
		return nil
	}
	// A slot walcount's state does not know, or one that would decode
	// changes made before the publication (run would then fail for good
	// on PostgreSQL before 18), is not walcount's to adopt.
	view, err := publication.SlotSees(r.ctx, r.conn, r.slotConn, name, r.cfg.Publication)
	if err != nil {
		return r.queryFailed(CheckSlot, "slot "+name, err)
	}
	if view.Stale {
		r.setupProblem(CheckSlot, view.Why+"; walcount will not stream from it",
			"walcount setup (it drops the slot and creates it anew after the publication; walcount run then repairs every counter by itself) — stop walcount run first")
		return nil
	}
	state := "inactive"
	if s.Active {
		state = "active"
	}
	status := "unknown"
	if s.WALStatus != nil {
		status = *s.WALStatus
	}
	r.ok(CheckSlot, fmt.Sprintf("replication slot %s: pgoutput, %s, wal_status %s", name, state, status))
	return nil
}

// hasCheckpoint reports whether walcount's state holds a checkpoint for
// the slot: walcount was set up for it.
func (r *run) hasCheckpoint() bool {
	if v, err := state.ReadVersion(r.ctx, r.conn); err != nil || v > state.Version {
		return false
	}
	_, err := state.ReadCheckpoint(r.ctx, r.conn, r.cfg.Slot)
	return err == nil
}

// checkCheckpoint checks walcount's checkpoint table (design rule 1):
// that it exists, that the role may read and move it, and that it has this
// slot's row. A row behind the slot's confirmed position means changes in
// between were acknowledged without being counted.
func (r *run) checkCheckpoint() error {
	access, err := state.StateAccess(r.ctx, r.conn)
	if err != nil {
		return r.queryFailed(CheckCheckpoint, "walcount's state tables", err)
	}
	if !access.Exists {
		r.setupProblem(CheckCheckpoint, "table walcount.checkpoint does not exist", "walcount setup")
		return nil
	}
	if !access.Usage || len(access.Missing) > 0 {
		msg := fmt.Sprintf("role %s may not use walcount's state: it lacks USAGE on schema walcount", r.user)
		if access.Usage {
			msg = fmt.Sprintf("role %s may not use walcount's state: it lacks %s", r.user, strings.Join(access.Missing, "; "))
		}
		r.accessProblem(CheckCheckpoint, msg, state.AccessGrants(r.ident(r.user)))
		return nil
	}

	if err := state.CheckVersion(r.ctx, r.conn); err != nil {
		var newer *state.NewerError
		if errors.As(err, &newer) {
			r.configProblem(CheckCheckpoint, err.Error(), "upgrade walcount")
			return nil
		}
		if done := r.checkOlderSchema(err); done {
			return nil
		}
	}
	w, err := state.ReadCheckpoint(r.ctx, r.conn, r.cfg.Slot)
	if errors.Is(err, state.ErrNoCheckpoint) {
		r.setupProblem(CheckCheckpoint, fmt.Sprintf("walcount.checkpoint has no row for slot %s", r.cfg.Slot), "walcount setup")
		return nil
	}
	if err != nil {
		return r.queryFailed(CheckCheckpoint, "walcount.checkpoint", err)
	}
	lsnText := w.String()
	if r.slot != nil && r.slot.ConfirmedLSN != nil {
		c, errC := pglogrepl.ParseLSN(*r.slot.ConfirmedLSN)
		if errC == nil && w < c {
			r.warn(CheckCheckpoint,
				fmt.Sprintf("checkpoint %s of slot %s is behind the slot's confirmed position %s: if the slot was advanced by hand, changes in between were never counted (walcount itself confirms past its checkpoint only to let PostgreSQL shut down while nothing was streaming, which loses nothing)", w, r.cfg.Slot, c),
				"nothing: walcount run tells the two cases apart at start, and in the first marks every counter dirty and repairs it")
			return nil
		}
	}
	r.ok(CheckCheckpoint, fmt.Sprintf("walcount.checkpoint of slot %s is at %s", r.cfg.Slot, lsnText))
	return nil
}

// checkOlderSchema reports a state schema older than this walcount's
// (err is CheckVersion's): walcount run migrates it at start when its role
// may (a warning), and a person must when it may not (a problem with the
// statements and the role that runs them). It returns false when the
// checkpoint is to be checked still.
func (r *run) checkOlderSchema(err error) bool {
	from, verr := state.ReadVersion(r.ctx, r.conn)
	if verr != nil || from >= state.Version {
		r.setupProblem(CheckCheckpoint, err.Error(), "walcount setup")
		return true
	}
	m, merr := state.ReadMigrator(r.ctx, r.conn)
	if merr != nil {
		_ = r.queryFailed(CheckCheckpoint, "the owner of schema walcount", merr)
		return true
	}
	if !m.May {
		perr := &state.MigrationPrivilegeError{From: from, Migrator: m, Statements: state.UpgradeScript(from, m.Role, r.cfg.Publication)}
		r.accessProblem(CheckCheckpoint, fmt.Sprintf("walcount's state schema is version %d and this walcount needs version %d; role %s may not migrate it (schema walcount and its tables are owned by %s)", from, state.Version, m.Role, m.Owner),
			fmt.Sprintf("as role %s: walcount setup, or these statements in one transaction: %s", m.Owner, strings.ReplaceAll(state.Script(perr.Statements), "\n", " ")))
		return true
	}
	r.warn(CheckCheckpoint, fmt.Sprintf("walcount's state schema is version %d; walcount run migrates it to version %d when it takes the slot, keeping the checkpoint and every carried delta", from, state.Version),
		"nothing: walcount run does it (walcount setup does too)")
	return false
}

// checkOwnership checks that this slot keeps the counters' columns and no
// other slot does (design rule 15): two deployments on one column count
// every change twice.
func (r *run) checkOwnership() error {
	if err := state.CheckVersion(r.ctx, r.conn); err != nil {
		return nil // reported by checkCheckpoint
	}
	err := state.CheckOwnership(r.ctx, r.conn, r.cfg.Slot, r.cfg.Counters)
	var owned *state.OwnedError
	switch {
	case err == nil:
		r.ok(CheckOwnership, fmt.Sprintf("slot %s keeps the counter columns", r.cfg.Slot))
	case errors.As(err, &owned):
		r.problem(CheckOwnership, fmt.Sprintf("%s.%s is kept by slot %s: a second slot on it would count every change twice", owned.Table, owned.Column, owned.Owner),
			fmt.Sprintf("keep one deployment per column: to move it, stop the walcount of slot %s and run walcount teardown --slot %s (which releases its columns), then walcount setup",
				owned.Owner, owned.Owner))
	case errors.Is(err, state.ErrNotClaimed):
		r.setupProblem(CheckOwnership, err.Error(), "walcount setup")
	default:
		return r.queryFailed(CheckOwnership, "the owners of the counter columns", err)
	}
	return nil
}
