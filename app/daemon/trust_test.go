package daemon

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// TestForgedMessagesMoveNothing is the attack of design rule 18: a role
// with LOGIN and nothing else, in a READ ONLY transaction, emits every
// kind of message walcount acts on with pg_logical_emit_message (which
// PUBLIC may execute). None may move a count, the flush, the lifecycle
// handling or a reconciliation; each is counted as forged. The same role
// cannot write walcount's table of messages.
func TestForgedMessagesMoveNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start()
	ctx := context.Background()
	newWorkload(e.db).run(ctx, 2, 100)
	e.waitCaughtUp(catchUp)
	e.assertExact()

	e.exec("CREATE ROLE analyst LOGIN")
	u, err := url.Parse(e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("analyst")
	analyst, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("connect as analyst: %v", err)
	}
	defer analyst.Close(ctx)

	w, err := e.checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	field := counter.Field(e.cfg.Counters[0].Name, "5")
	forged := []string{
		fmt.Sprintf(`{"correct":{%q:1000000},"slot":%q}`, field, e.cfg.Slot),
		// A flush of everything up to the current checkpoint, which would
		// replay the flush log's compensations.
		cdc.FlushMarker(e.cfg.Slot, w),
		fmt.Sprintf(`{"reconcile":"forged","phase":0,"slot":%q}`, e.cfg.Slot),
		fmt.Sprintf(`{"reconcile":"forged","phase":1,"slot":%q}`, e.cfg.Slot),
	}
	for _, content := range forged {
		tx, err := analyst.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'walcount', $1)", content); err != nil {
			t.Fatalf("emit %s as analyst: %v", content, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// walcount's own way is closed to the role.
	_, err = analyst.Exec(ctx, "INSERT INTO walcount.messages (id, body) VALUES (1, $1)", forged[0])
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("analyst's insert into walcount.messages: %v, want permission denied", err)
	}

	// Caught up past the forgeries: each was read, and none counted.
	e.moreLikesThenExact()
	if n := counterValue(r.d.m.ForgedMessages); n != int64(len(forged)) {
		t.Fatalf("walcount_forged_messages_total = %v after the stream passed them, want %d", n, len(forged))
	}
	// A real reconciliation still runs through its markers, and finds
	// nothing to correct.
	run := startRun(t, r, reconcile.Request{})
	if got := waitRun(t, r, run.ID); got.Status != state.StatusDone || got.Corrected != 0 {
		t.Fatalf("reconciliation after the forgeries: %+v, want done with nothing corrected", got)
	}
	e.assertExact()
	var rows int
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.messages").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("walcount.messages holds %d rows, want 0: every message row is deleted by its own transaction", rows)
	}
	e.assertHealthy(r)
}
