package setup

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/state"
)

// slotWaitPoll is how long a slot creation runs before walcount setup
// says what it waits for, and how often it looks again.
const slotWaitPoll = 2 * time.Second

// watchSlotCreation tells w, once per transaction, what the creation of
// slot on the connection of backend creator waits for: PostgreSQL creates a
// logical slot only once every transaction that held an xid when the
// creation began has ended, and nothing says so. It watches over a
// connection of its own to dbURL; nil w watches nothing. The returned
// function ends the watch.
func watchSlotCreation(ctx context.Context, dbURL, slot string, creator uint32, w io.Writer) (stop func()) {
	if w == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(slotWaitPoll)
		defer t.Stop()
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		told := int32(-1)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if conn == nil {
				c, err := pgx.Connect(ctx, dbURL)
				if err != nil {
					continue
				}
				conn = c
			}
			x, ok, err := state.OldestXact(ctx, conn, creator)
			if err != nil || ctx.Err() != nil || !ok || x.PID == told {
				continue
			}
			told = x.PID
			fmt.Fprintf(w, "creating replication slot %s waits for the oldest running transaction to end: pid %d, open %s, %s (application %q); "+
				"end it (COMMIT, or SELECT pg_terminate_backend(%d)) and the creation goes on\n",
				slot, x.PID, x.Age.Round(time.Second), x.State, x.ApplicationName, x.PID)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
