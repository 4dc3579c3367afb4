package cdc

import (
	"context"
	"testing"
	"time"
)

// TestWideRowsAreBoundedInBytes: 16 rows of 1 MB of text in one
// transaction, then all deleted in one (REPLICA IDENTITY FULL: each
// delete carries the whole old row), stream to a consumer that holds the
// batches it gets. Before, the 16 rows were one batch of 16 MB, which the
// queue's byte budget (4 MiB here) lets through alone; now a batch is cut
// at about 1 MiB decoded, so no batch holds more than its budget and one
// row, and the queue's bytes never pass its bound, while every row still
// arrives, in order.
func TestWideRowsAreBoundedInBytes(t *testing.T) {
	t.Parallel()
	const rows, width, budget = 16, 1_000_000, 4 << 20
	f := newStreamFixture(t)
	f.exec(t, `CREATE TABLE wide (id bigint PRIMARY KEY, body text NOT NULL)`)
	f.exec(t, `ALTER TABLE wide REPLICA IDENTITY FULL`)
	f.exec(t, `ALTER PUBLICATION walcount ADD TABLE wide`)
	var start LSN
	if err := f.conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&start); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Connect(ctx, StreamConfig{ConnString: f.url, Slot: f.name, Publication: "walcount", StartLSN: start, QueueBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-runDone
		s.Close()
	}()
	f.exec(t, `INSERT INTO wide SELECT g, repeat(chr(96 + g), $1) FROM generate_series(1, $2) g`, width, rows)
	f.exec(t, `DELETE FROM wide`)

	// The consumer holds every batch it gets and releases the oldest only
	// when no batch came for a while: the stream then has filled the
	// queue up to its budget and waits. The pause only paces the test;
	// the bound is checked on every batch, whatever the timing.
	var held []*Batch
	var inserts, deletes int
	var peak, widest int64
	timeout := time.After(2 * time.Minute)
	for inserts < rows || deletes < rows {
		select {
		case b := <-s.Batches():
			held = append(held, b)
			peak, widest = max(peak, s.QueueBytes()), max(widest, b.charged)
			for i := range b.Events {
				ev := &b.Events[i]
				if ev.Kind != KindChange || ev.Rel.Name != "wide" {
					continue
				}
				switch row := ev.New; ev.Op {
				case OpInsert:
					if inserts++; len(row.Cols) != 2 || len(row.Cols[1].Data) != width || row.Cols[1].Data[0] != byte(96+inserts) {
						t.Fatalf("insert %d arrived wrong", inserts)
					}
				case OpDelete:
					if deletes++; len(ev.Old.Cols) != 2 || len(ev.Old.Cols[1].Data) != width {
						t.Fatalf("delete %d arrived without the old row", deletes)
					}
				}
			}
		case <-time.After(200 * time.Millisecond):
			if len(held) == 0 {
				continue
			}
			s.Release(held[0])
			held = held[1:]
		case err := <-runDone:
			t.Fatalf("stream ended: %v", err)
		case <-timeout:
			t.Fatalf("%d inserts and %d deletes of %d arrived", inserts, deletes, rows)
		}
	}
	t.Logf("%d rows of %d bytes inserted and deleted: the widest batch held %d bytes, the queue at most %d of %d",
		rows, width, widest, peak, budget)
	if limit := DefaultBatchBytes + 2*width; widest > int64(limit) {
		t.Errorf("a batch held %d bytes; want at most its budget %d and one message's row", widest, DefaultBatchBytes)
	}
	if peak > budget {
		t.Errorf("the queue held %d bytes; its bound is %d", peak, budget)
	}
	if peak < budget-int64(DefaultBatchBytes+2*width) {
		t.Errorf("the queue held at most %d bytes: the consumer never let it fill up to its bound %d", peak, budget)
	}
	for _, b := range held {
		s.Release(b)
	}
	if got := s.QueueBytes(); got != 0 {
		t.Errorf("QueueBytes = %d after every batch was released", got)
	}
}
