package slot

import (
	"errors"
	"fmt"
	"github.com/walcount/walcount/internal/operator"
)

var (
	// ErrSlotLost means the replication slot was invalidated: WAL it needed
	// was removed, so the stream can no longer deliver every change. Every
	// *SlotLostError wraps it.
	ErrSlotLost = errors.New("replication slot lost")
	// ErrSlotNotFound means no replication slot has the configured name.
	ErrSlotNotFound = errors.New("replication slot not found")
	// ErrLagTooHigh means the slot lags further behind the server than the
	// configured maximum.
	ErrLagTooHigh = errors.New("replication slot lag too high")
	// ErrNotRead means the slot's status has not been read yet, or the last
	// successful read is too old to trust.
	ErrNotRead = errors.New("replication slot status unknown")
	// ErrInUse is wrapped when another process streams from the slot
	// (START_REPLICATION refused; cdc.ErrSlotInUse).
	ErrInUse = errors.New("replication slot is in use by another process")
	// ErrMissing is wrapped when START_REPLICATION finds no slot
	// (cdc.ErrSlotMissing).
	ErrMissing = operator.NewError("replication slot does not exist")
)

// walRemoved is the PostgreSQL 17+ invalidation_reason of a slot whose WAL was
// removed, the only reason on a primary before PostgreSQL 17.
const walRemoved = "wal_removed"

// SlotLostError reports an invalidated replication slot. It wraps
// ErrSlotLost. Recovering from it takes an operator: the slot must be
// recreated, which skips every change in the lost WAL, and the counters
// then reconciled against the rows (design rule 12).
type SlotLostError struct {
	// Slot is the slot name.
	Slot string
	// WALStatus is pg_replication_slots.wal_status; empty when it was NULL
	// (restart_lsn is NULL).
	WALStatus string
	// Reason is pg_replication_slots.invalidation_reason (PostgreSQL 17+),
	// or "conflicting" on PostgreSQL 16; empty when the server does not say.
	Reason string
}

// Invalidation reasons PostgreSQL reports in
// pg_replication_slots.invalidation_reason (17+).
const (
	ReasonWALRemoved  = walRemoved
	ReasonIdleTimeout = "idle_timeout"
)

// reasonMeaning says in words why PostgreSQL invalidated a slot.
var reasonMeaning = map[string]string{
	walRemoved:               "WAL the slot needed was removed (max_slot_wal_keep_size)",
	ReasonIdleTimeout:        "the slot had no reader for longer than idle_replication_slot_timeout",
	"rows_removed":           "rows the slot needed were removed on the primary (a standby's slot)",
	"wal_level_insufficient": "wal_level on the primary is no longer logical (a standby's slot)",
	"conflicting":            "the slot conflicted with recovery on a standby",
}

// InvalidationMeaning says in words what an invalidation_reason means;
// the reason itself when it is not one walcount knows.
func InvalidationMeaning(reason string) string {
	if m, ok := reasonMeaning[reason]; ok {
		return m
	}
	return reason
}

func (e *SlotLostError) Error() string {
	status := e.WALStatus
	if status == "" {
		status = "null"
	}
	const todo = "counts can no longer be kept exact from the stream. " +
		"Run `walcount setup --recreate-slot` (walcount then repairs every counter by itself), or set on_slot_loss: recreate"
	if e.Reason != "" && e.Reason != walRemoved {
		return fmt.Sprintf("replication slot %q is invalidated (wal_status=%s, invalidation_reason=%s: %s): "+
			"the server will not decode changes for it any more; %s", e.Slot, status, e.Reason, InvalidationMeaning(e.Reason), todo)
	}
	return fmt.Sprintf("replication slot %q is lost (wal_status=%s): WAL it needed was removed; %s",
		e.Slot, status, todo)
}

// NeedsOperator is true: the slot must be recreated (operator.Needed).
func (e *SlotLostError) NeedsOperator() bool { return true }

// Unwrap makes errors.Is(err, ErrSlotLost) true.
func (e *SlotLostError) Unwrap() error { return ErrSlotLost }
