package servers_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// startPostgres starts a cluster that the test's cleanup closes.
func startPostgres(tb testing.TB, opt servers.PostgresOptions) *servers.Postgres {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := servers.StartPostgres(ctx, opt)
	if err != nil {
		tb.Fatalf("StartPostgres: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("close postgres: %v", err)
		}
	})
	return p
}

// connect opens a connection that the test's cleanup closes.
func connect(tb testing.TB, p *servers.Postgres) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		tb.Fatalf("connect %s: %v\nserver log:\n%s", p.URL(), err, p.LogTail(20))
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// queryString runs a query that returns one text value.
func queryString(tb testing.TB, conn *pgx.Conn, sql string) string {
	tb.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestFindPostgresBin(t *testing.T) {
	dir, err := servers.FindPostgresBin()
	if err != nil {
		t.Fatalf("FindPostgresBin: %v", err)
	}
	for _, name := range []string{"initdb", "postgres", "pg_ctl"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("FindPostgresBin() = %s, which lacks %s: %v", dir, name, err)
		}
	}
}

// TestSelectedPostgresRuns checks that the cluster runs the binaries
// SelectPostgres describes, of the version WALCOUNT_TEST_PG asks for.
func TestSelectedPostgresRuns(t *testing.T) {
	b, err := servers.SelectPostgres()
	if err != nil {
		t.Fatalf("SelectPostgres: %v", err)
	}
	t.Logf("PostgreSQL %s", b)
	if want := os.Getenv(servers.EnvTestPG); want != "" && strconv.Itoa(b.Major) != strings.TrimSpace(want) {
		t.Errorf("%s=%s selected PostgreSQL %s", servers.EnvTestPG, want, b)
	}
	if major, err := servers.PostgresMajor(); err != nil || major != b.Major {
		t.Errorf("PostgresMajor() = %d, %v, want %d", major, err, b.Major)
	}
	p := startPostgres(t, servers.PostgresOptions{})
	if p.Major() != b.Major {
		t.Errorf("Major() = %d, want %d", p.Major(), b.Major)
	}
	conn := connect(t, p)
	if got, want := queryString(t, conn, "SELECT (current_setting('server_version_num')::int / 10000)::text"), strconv.Itoa(b.Major); got != want {
		t.Errorf("server major version = %s, want %s", got, want)
	}
	if got := queryString(t, conn, "SHOW server_version"); !strings.HasPrefix(got, b.Version) {
		t.Errorf("server_version = %s, want %s...", got, b.Version)
	}
}

func TestPostgresDefaults(t *testing.T) {
	p := startPostgres(t, servers.PostgresOptions{})
	conn := connect(t, p)
	want := map[string]string{
		"wal_level":             "logical",
		"max_replication_slots": "20",
		"max_wal_senders":       "20",
		"fsync":                 "on",
		"listen_addresses":      "127.0.0.1",
		"shared_buffers":        "32MB",
	}
	for name, value := range want {
		if got := queryString(t, conn, "SHOW "+name); got != value {
			t.Errorf("SHOW %s = %q, want %q", name, got, value)
		}
	}
	if got := queryString(t, conn, "SELECT current_user"); got != "postgres" {
		t.Errorf("current_user = %q, want postgres", got)
	}
	if !strings.Contains(p.URL(), "127.0.0.1:") || p.Port() == 0 {
		t.Errorf("URL() = %q, Port() = %d", p.URL(), p.Port())
	}
}

func TestPostgresReplicationConnection(t *testing.T) {
	p := startPostgres(t, servers.PostgresOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, p.URL()+"&replication=database")
	if err != nil {
		t.Fatalf("replication connect: %v\n%s", err, p.LogTail(20))
	}
	defer conn.Close(ctx)
	res, err := conn.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
	if err != nil {
		t.Fatalf("IDENTIFY_SYSTEM: %v", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("IDENTIFY_SYSTEM returned %v", res)
	}
	res, err = conn.Exec(ctx, "CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput").ReadAll()
	if err != nil {
		t.Fatalf("CREATE_REPLICATION_SLOT: %v (%v)", err, res)
	}
}

func TestPostgresStopStartKeepsData(t *testing.T) {
	for _, mode := range []string{servers.StopFast, servers.StopSmart, servers.StopImmediate} {
		t.Run(mode, func(t *testing.T) {
			p := startPostgres(t, servers.PostgresOptions{})
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, p.URL())
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if _, err := conn.Exec(ctx, "CREATE TABLE t (id int); INSERT INTO t SELECT generate_series(1, 1000)"); err != nil {
				t.Fatalf("fill table: %v", err)
			}
			// A smart shutdown waits for clients; disconnect first.
			conn.Close(ctx)
			port := p.Port()

			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := p.Stop(stopCtx, mode); err != nil {
				t.Fatalf("Stop(%s): %v", mode, err)
			}
			if p.Running() {
				t.Fatal("Running() after Stop = true")
			}
			if _, err := pgx.Connect(ctx, p.URL()); err == nil {
				t.Fatal("connect after Stop succeeded")
			}
			if err := p.Stop(stopCtx, mode); err != nil {
				t.Errorf("second Stop(%s) = %v, want nil", mode, err)
			}
			if err := p.Start(stopCtx); err != nil {
				t.Fatalf("Start after Stop(%s): %v", mode, err)
			}
			if p.Port() != port {
				t.Errorf("Port() after restart = %d, want %d", p.Port(), port)
			}
			conn2 := connect(t, p)
			if got := queryString(t, conn2, "SELECT count(*)::text FROM t"); got != "1000" {
				t.Errorf("rows after Stop(%s) and Start = %s, want 1000", mode, got)
			}
			if mode == servers.StopImmediate {
				if log := p.LogTail(200); !strings.Contains(log, "not properly shut down") {
					t.Errorf("log after immediate stop does not show crash recovery:\n%s", log)
				}
			}
		})
	}
}

func TestPostgresStartWhileRunning(t *testing.T) {
	p := startPostgres(t, servers.PostgresOptions{})
	if err := p.Start(context.Background()); !errors.Is(err, servers.ErrRunning) {
		t.Fatalf("Start on a running server = %v, want ErrRunning", err)
	}
}

func TestPostgresStopUnknownMode(t *testing.T) {
	p := startPostgres(t, servers.PostgresOptions{})
	if err := p.Stop(context.Background(), "abrupt"); err == nil {
		t.Fatal("Stop(abrupt) = nil, want an error")
	}
}

func TestPostgresSettings(t *testing.T) {
	p := startPostgres(t, servers.PostgresOptions{Settings: map[string]string{
		"max_replication_slots": "7",
		"application_name":      "it's quoted",
	}})
	conn := connect(t, p)
	if got := queryString(t, conn, "SHOW max_replication_slots"); got != "7" {
		t.Errorf("max_replication_slots = %s, want 7", got)
	}

	ctx := context.Background()
	err := p.SetSettings(ctx, map[string]string{"wal_level": "replica", "max_slot_wal_keep_size": "64MB"})
	if err != nil {
		t.Fatalf("SetSettings: %v", err)
	}
	conn.Close(ctx)
	if err := p.Stop(ctx, servers.StopFast); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	conn = connect(t, p)
	if got := queryString(t, conn, "SHOW wal_level"); got != "replica" {
		t.Errorf("wal_level after SetSettings = %s, want replica", got)
	}
	if got := queryString(t, conn, "SHOW max_slot_wal_keep_size"); got != "64MB" {
		t.Errorf("max_slot_wal_keep_size after SetSettings = %s, want 64MB", got)
	}
	// ALTER SYSTEM must still be able to read and rewrite the file.
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET work_mem = '8MB'"); err != nil {
		t.Fatalf("ALTER SYSTEM after SetSettings: %v", err)
	}
	if err := p.SetSettings(ctx, map[string]string{"bad name": "x"}); err == nil {
		t.Error("SetSettings(bad name) = nil, want an error")
	}
}

func TestPostgresInvalidSettingFailsWithLog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: map[string]string{"max_connections": "lots"}})
	if err == nil {
		p.Close()
		t.Fatal("StartPostgres with max_connections=lots succeeded")
	}
	if !strings.Contains(err.Error(), "max_connections") {
		t.Errorf("error does not quote the server log: %v", err)
	}
}

func TestPostgresCloseRemovesEverything(t *testing.T) {
	p := startPostgres(t, servers.PostgresOptions{})
	dataDir := p.DataDir()
	url := p.URL()
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("data dir after Close: stat error %v, want not exist", err)
	}
	if _, err := pgx.Connect(context.Background(), url); err == nil {
		t.Error("connect after Close succeeded")
	}
	if err := p.Start(context.Background()); !errors.Is(err, servers.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
}

func TestPostgresDirIsKept(t *testing.T) {
	dir, err := os.MkdirTemp("", "walcount-servers-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	p := startPostgres(t, servers.PostgresOptions{Dir: dir})
	ctx := context.Background()
	conn := connect(t, p)
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (id int)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// A second StartPostgres on the same Dir finds the same cluster.
	p2 := startPostgres(t, servers.PostgresOptions{Dir: dir})
	conn2 := connect(t, p2)
	if got := queryString(t, conn2, "SELECT to_regclass('kept')::text"); got != "kept" {
		t.Errorf("table after reopening Dir = %q, want kept", got)
	}
}

func TestPostgresFixedPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := servers.StartPostgres(ctx, servers.PostgresOptions{Port: port})
	if err == nil {
		p.Close()
		t.Fatalf("StartPostgres on busy port %d succeeded", port)
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Errorf("error does not say the port is in use: %v", err)
	}
}

func TestPostgresParallelStarts(t *testing.T) {
	const n = 4
	var wg sync.WaitGroup
	ports := make([]int, n)
	for i := range n {
		wg.Go(func() {
			p := startPostgres(t, servers.PostgresOptions{})
			ports[i] = p.Port()
			conn := connect(t, p)
			queryString(t, conn, "SELECT 'ok'")
		})
	}
	wg.Wait()
	seen := map[int]bool{}
	for _, port := range ports {
		if seen[port] {
			t.Errorf("port %d used twice: %v", port, ports)
		}
		seen[port] = true
	}
}

// BenchmarkStartPostgres measures a cluster start from the cached template.
func BenchmarkStartPostgres(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		p, err := servers.StartPostgres(ctx, servers.PostgresOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
