package daemon

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/walcount/walcount/app/config"
)

// TestSlotCreationWaitIsShown recreates a missing slot (on_slot_loss:
// recreate, as after a failover to a server without a copy of the slot)
// while an app transaction holds an xid: PostgreSQL's slot creation waits
// for it, and nothing is counted meanwhile. That wait must be visible: a
// log line and /status name the oldest running transaction's pid and age,
// and /readyz fails. Once the transaction ends the slot is created, and the
// counts are repaired and exact.
func TestSlotCreationWaitIsShown(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, schema, func(e *env) { e.cfg.OnSlotLoss = config.SlotLossRecreate })
	ctx := context.Background()
	first := e.start()
	newWorkload(e.db).run(ctx, 2, 30)
	e.waitCaughtUp(catchUp)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	e.exec("SELECT pg_drop_replication_slot($1)", e.cfg.Slot)

	// The app's transaction: it wrote, so it holds an xid, and stays open.
	tx, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	var appPID int32
	if err := tx.QueryRow(ctx, "INSERT INTO likes (post_id) VALUES (7) RETURNING pg_backend_pid()").Scan(&appPID); err != nil {
		t.Fatal(err)
	}

	s := e.serve()
	const said = "creating the replication slot waits for the oldest running transaction to end"
	poll(t, "/status to show what the slot creation waits for", func() (bool, string) {
		st := s.status(t)
		w := st.SlotCreationWait
		if w == nil {
			return false, "no slot_creation_wait in /status"
		}
		return w.PID == appPID && w.XactAgeSeconds > 0 && s.count(said, zapcore.WarnLevel) >= 1,
			fmt.Sprintf("slot_creation_wait %+v (app pid %d), %d log lines", *w, appPID, s.count(said, zapcore.WarnLevel))
	})
	if code, body := s.get(t, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d while the slot is being created, want 503: %s", code, body)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s.waitReadyz(t, http.StatusOK, "the daemon to stream once the transaction ended", nil)
	if w := s.status(t).SlotCreationWait; w != nil {
		t.Errorf("/status still shows a slot creation wait after it ended: %+v", *w)
	}
	newWorkload(e.db).run(ctx, 2, 30)
	e.waitClean(t, catchUp)
	e.assertExact()
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
}
