package reconcile

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Snapshot is a pg_snapshot (pg_current_snapshot()): transactions with
// 64-bit ids below Xmin have completed, those at or above Xmax had not
// started, and those in Xip were in progress. See
// https://www.postgresql.org/docs/15/functions-info.html#FUNCTIONS-PG-SNAPSHOT-PARTS.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64 // sorted
}

// ParseSnapshot parses the text form "xmin:xmax:xip1,xip2,...".
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("parse snapshot %q: want xmin:xmax:xip", s)
	}
	var snap Snapshot
	var err error
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("parse snapshot %q: xmin: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("parse snapshot %q: xmax: %w", s, err)
	}
	if snap.Xmin > snap.Xmax {
		return Snapshot{}, fmt.Errorf("parse snapshot %q: xmin above xmax", s)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("parse snapshot %q: xip: %w", s, err)
			}
			snap.Xip = append(snap.Xip, v)
		}
		slices.Sort(snap.Xip)
	}
	return snap, nil
}

// Widen turns a 32-bit xid, as pgoutput sends it, into the 64-bit id
// (epoch << 32 | xid) nearest to the snapshot's xmax. Every transaction
// walcount compares is within 2^31 of xmax (PostgreSQL's wraparound
// horizon), so the nearest one is the right one, on either side of an
// epoch boundary.
func (s Snapshot) Widen(xid uint32) uint64 {
	diff := int32(xid - uint32(s.Xmax))
	return uint64(int64(s.Xmax) + int64(diff))
}

// Visible reports whether the transaction with 32-bit id xid, known to
// have committed, had committed when the snapshot was taken.
func (s Snapshot) Visible(xid uint32) bool {
	full := s.Widen(xid)
	if full >= s.Xmax {
		return false
	}
	if full < s.Xmin {
		return true
	}
	_, found := slices.BinarySearch(s.Xip, full)
	return !found
}
