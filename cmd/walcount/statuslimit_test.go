package main

import (
	"context"
	"strings"
	"testing"

	"github.com/walcount/walcount/slot"
)

// TestStatusSlotPastLimit drives an inactive slot past
// max_slot_wal_keep_size with no checkpoint to remove the WAL yet, where
// pg_replication_slots.safe_wal_size turns negative. walcount status used
// to print "safe_wal_size -83099632 B more WAL"; it now says the slot is
// past the limit, by how much, and what the next checkpoint does.
func TestStatusSlotPastLimit(t *testing.T) {
	t.Parallel()
	// No checkpoint may run before status reads the slot: it would
	// invalidate it. The timeout and max_wal_size keep the server's own
	// checkpoints away for the test's few seconds.
	c := newCluster(t, map[string]string{
		"max_slot_wal_keep_size": "1MB", "checkpoint_timeout": "1h", "max_wal_size": "4GB",
	})
	conn := c.connect(t)
	ctx := context.Background()
	var st slot.SlotStatus
	poll(t, "safe_wal_size to turn negative", func() (bool, string) {
		c.like(t, 100)
		if _, err := conn.Exec(ctx, "SELECT pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
		var err error
		if st, err = slot.ReadSlot(ctx, conn, c.cfg.Slot); err != nil {
			t.Fatal(err)
		}
		return st.SafeWALSizeBytes != nil && *st.SafeWALSizeBytes < 0 && !st.Invalidated, st.WALStatus
	})
	out := status(t, c.cfg, false)
	t.Logf("walcount status:\n%s", out)
	if !says(out, "safe_wal_size PAST THE LIMIT by ") || !strings.Contains(out, "the next checkpoint may remove WAL it needs") {
		t.Errorf("status does not say the slot is past max_slot_wal_keep_size")
	}
	if strings.Contains(out, "B more WAL") {
		t.Errorf("status prints a negative size as more WAL to go")
	}
	if st.WALStatus == slot.WALUnreserved && !strings.Contains(out, "more than max_slot_wal_keep_size allows") {
		t.Errorf("the unreserved warning does not say by how much the slot is past the limit")
	}
}
