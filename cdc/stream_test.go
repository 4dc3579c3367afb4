package cdc

import (
	"context"
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// streamFixture is a database with a published likes table and a slot.
type streamFixture struct {
	url  string
	conn *pgx.Conn
	slot LSN
	// name is the fixture's own slot: slots are the server's, not the
	// database's, and the package's tests run in parallel on one server.
	name string
}

func newStreamFixture(t *testing.T) *streamFixture {
	t.Helper()
	url := testenv.Database(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	for _, q := range []string{
		appschema.SQL(appschema.Options{DefaultIdentity: true}),
		`CREATE PUBLICATION walcount FOR TABLE likes`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var start, name string
	if err := conn.QueryRow(ctx, `SELECT 'walcount_' || current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, name).Scan(&start); err != nil {
		t.Fatal(err)
	}
	f := &streamFixture{url: url, conn: conn, name: name}
	if f.slot, err = pglogrepl.ParseLSN(start); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *streamFixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), q, args...); err != nil {
		t.Fatal(err)
	}
}

// lowWater reads SO_RCVLOWAT off the stream's socket.
func lowWater(t *testing.T, s *Stream) int {
	t.Helper()
	v, err := lowWaterOf(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func lowWaterOf(s *Stream) (int, error) {
	tcp, ok := s.conn.Conn().(*net.TCPConn)
	if !ok {
		return 0, errors.New("the replication connection is not TCP")
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return 0, err
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	}); err != nil {
		return 0, err
	}
	return v, gerr
}

// collect sends the running count of committed transactions after
// every batch, until the stream stops.
func collect(s *Stream, got chan<- int) {
	commits := 0
	for b := range s.Batches() {
		for i := range b.Events {
			if b.Events[i].Kind == KindCommit {
				commits++
			}
		}
		s.Release(b)
		got <- commits
	}
	close(got)
}

func waitCommits(t *testing.T, got <-chan int, want int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case n, ok := <-got:
			if !ok {
				t.Fatalf("stream ended before %d commits", want)
			}
			if n >= want {
				if n > want {
					t.Fatalf("got %d commits, want %d", n, want)
				}
				return
			}
		case <-timeout:
			t.Fatalf("fewer than %d commits arrived within a minute", want)
		}
	}
}

// TestStreamCoalescing checks the read coalescing of a live stream: a
// burst of single-row transactions raises the socket's low-water mark, a
// quiet window puts it back to one byte (so an idle stream sleeps until
// the next message, however small), a lone transaction after the burst
// still arrives, and Close ends the stream cleanly with the slot
// confirming W.
func TestStreamCoalescing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("read coalescing is Linux-only")
	}
	f := newStreamFixture(t)
	// The procedure is made before the stream's start: PostgreSQL 14's
	// pgoutput sends empty transactions (a DDL's) as BEGIN and COMMIT,
	// which would count as one more commit.
	f.exec(t, `CREATE PROCEDURE burst(n int) LANGUAGE plpgsql AS $$
BEGIN FOR i IN 1..n LOOP INSERT INTO likes (post_id) VALUES (i); COMMIT; END LOOP; END $$`)
	var start LSN
	if err := f.conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&start); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Connect(ctx, StreamConfig{
		ConnString:     f.url,
		Slot:           f.name,
		Publication:    "walcount",
		StartLSN:       start,
		CoalesceWindow: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	got := make(chan int, 1024)
	go collect(s, got)

	if lw := lowWater(t, s); lw != 1 {
		t.Fatalf("SO_RCVLOWAT before any data = %d, want 1", lw)
	}
	// A burst: 2000 transactions of one row each, from a procedure that
	// commits after every row, so they arrive back to back.
	sampled := make(chan int)
	stopSampling := make(chan struct{})
	go func() {
		highest := 0
		for {
			if v, err := lowWaterOf(s); err == nil {
				highest = max(highest, v)
			}
			select {
			case <-stopSampling:
				sampled <- highest
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	f.exec(t, `CALL burst(2000)`)
	waitCommits(t, got, 2000)
	close(stopSampling)
	if highest := <-sampled; highest != coalesceLowWater {
		t.Errorf("SO_RCVLOWAT during the burst peaked at %d, want %d", highest, coalesceLowWater)
	}

	// Quiet: the stream drops its low-water mark again.
	if !wait.Until(30*time.Second, 5*time.Millisecond, func() bool { return lowWater(t, s) == 1 }) {
		t.Fatalf("SO_RCVLOWAT still %d long after the burst", lowWater(t, s))
	}
	// One small transaction still gets through.
	f.exec(t, `INSERT INTO likes (post_id) VALUES (1)`)
	waitCommits(t, got, 2001)

	// Acknowledge everything received; Close must leave the slot there.
	w := s.ReceivedLSN()
	s.Ack(w)
	cancel()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
	s.Close()
	var confirmed string
	if err := f.conn.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.name).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	c, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		t.Fatal(err)
	}
	if c != w {
		t.Fatalf("slot confirmed %s after Close, want W = %s", c, w)
	}
}
