package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
)

// pgConnect opens a connection that the test's cleanup closes.
func pgConnect(tb testing.TB, url string) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("connect %s: %v", url, err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// redisConnect opens a client that the test's cleanup closes.
func redisConnect(tb testing.TB, rawURL string) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		tb.Fatalf("parse %s: %v", rawURL, err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { c.Close() })
	return c
}

// databaseExists asks the server at admin whether the database exists.
func databaseExists(tb testing.TB, admin, name string) bool {
	tb.Helper()
	conn := pgConnect(tb, admin)
	var ok bool
	err := conn.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&ok)
	if err != nil {
		tb.Fatalf("query pg_database: %v", err)
	}
	return ok
}

// dbName returns the database named in a URL.
func dbName(tb testing.TB, rawURL string) string {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func TestChooseSource(t *testing.T) {
	yes := func() bool { return true }
	no := func() bool { return false }
	mustNotAsk := func() bool { t.Error("Docker was asked although not needed"); return false }
	tests := []struct {
		name       string
		env        string
		local      bool
		docker     func() bool
		wantSource source
	}{
		{"environment wins", "postgres://x", true, mustNotAsk, sourceExternal},
		{"local binaries before docker", "", true, mustNotAsk, sourceLocal},
		{"docker as last resort", "", false, yes, sourceDocker},
		{"nothing", "", false, no, sourceNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chooseSource(tt.env, tt.local, tt.docker); got != tt.wantSource {
				t.Errorf("chooseSource() = %v, want %v", got, tt.wantSource)
			}
		})
	}
}

func TestPostgresHelper(t *testing.T) {
	p := Postgres(t, servers.PostgresOptions{Settings: map[string]string{"max_wal_senders": "5"}})
	conn := pgConnect(t, p.URL())
	var senders string
	if err := conn.QueryRow(context.Background(), "SHOW max_wal_senders").Scan(&senders); err != nil {
		t.Fatal(err)
	}
	if senders != "5" {
		t.Errorf("max_wal_senders = %s, want 5 (options not passed on)", senders)
	}
	conn.Close(context.Background())
	if err := p.Stop(context.Background(), servers.StopImmediate); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func TestRedisHelper(t *testing.T) {
	r := Redis(t)
	c := redisConnect(t, r.URL())
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if n, err := c.Exists(context.Background(), "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS k after kill and start = %d, %v; want 0, nil", n, err)
	}
}

func TestDatabaseIsolation(t *testing.T) {
	ctx := context.Background()
	var names []string
	t.Run("create", func(t *testing.T) {
		url1, url2 := Database(t), Database(t)
		if url1 == url2 {
			t.Fatalf("Database returned %s twice", url1)
		}
		names = []string{dbName(t, url1), dbName(t, url2)}
		c1, c2 := pgConnect(t, url1), pgConnect(t, url2)
		if _, err := c1.Exec(ctx, appschema.SQL(appschema.Options{})); err != nil {
			t.Fatal(err)
		}
		var found bool
		if err := c2.QueryRow(ctx, "SELECT to_regclass('likes') IS NOT NULL").Scan(&found); err != nil {
			t.Fatal(err)
		}
		if found {
			t.Error("a table created in one test database is visible in the other")
		}
		var level string
		if err := c2.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
			t.Fatal(err)
		}
		if level != "logical" {
			t.Errorf("wal_level = %s, want logical", level)
		}
	})
	admin, _, err := sharedPostgresURL()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if databaseExists(t, admin, name) {
			t.Errorf("database %s still exists after its test ended", name)
		}
	}
}

// TestDatabaseDropsSlotsAndWalsenders leaves an active logical replication
// connection and an inactive slot behind, as a crashed daemon would; the
// cleanup must still drop the database.
func TestDatabaseDropsSlotsAndWalsenders(t *testing.T) {
	ctx := context.Background()
	var name string
	t.Run("leave a mess", func(t *testing.T) {
		dbURL := Database(t)
		name = dbName(t, dbURL)
		repl, err := pgconn.Connect(ctx, dbURL+"&replication=database")
		if err != nil {
			t.Fatalf("replication connect: %v", err)
		}
		// Deliberately never closed: the cleanup terminates it.
		if _, err := pglogrepl.CreateReplicationSlot(ctx, repl, "active_slot", "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{}); err != nil {
			t.Fatalf("create slot: %v", err)
		}
		if err := pglogrepl.StartReplication(ctx, repl, "active_slot", 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'walcount'"},
		}); err != nil {
			t.Fatalf("start replication: %v", err)
		}
		conn := pgConnect(t, dbURL)
		var active bool
		if err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'active_slot'").Scan(&active); err != nil || !active {
			t.Fatalf("active_slot active = %v, %v; want true", active, err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('idle_slot', 'pgoutput')"); err != nil {
			t.Fatalf("create idle slot: %v", err)
		}
	})
	admin, _, err := sharedPostgresURL()
	if err != nil {
		t.Fatal(err)
	}
	if databaseExists(t, admin, name) {
		t.Fatalf("database %s survived its test", name)
	}
	conn := pgConnect(t, admin)
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = $1", name).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Errorf("%d slots of database %s survived its test", slots, name)
	}
}

func TestDatabaseOnExternalServer(t *testing.T) {
	p := Postgres(t)
	t.Setenv(EnvPostgresURL, p.URL())
	var name string
	t.Run("use", func(t *testing.T) {
		u := Database(t)
		if !strings.Contains(u, "127.0.0.1:"+strconv.Itoa(p.Port())+"/") {
			t.Errorf("Database() = %s, want a database on the external server %s", u, p.URL())
		}
		name = dbName(t, u)
		if !databaseExists(t, p.URL(), name) {
			t.Errorf("database %s not created on the external server", name)
		}
	})
	if databaseExists(t, p.URL(), name) {
		t.Errorf("database %s survived its test on the external server", name)
	}
}

func TestRedisURLIsolation(t *testing.T) {
	ctx := context.Background()
	u1, u2 := RedisURL(t), RedisURL(t)
	if u1 == u2 {
		t.Fatalf("RedisURL returned %s twice", u1)
	}
	c1, c2 := redisConnect(t, u1), redisConnect(t, u2)
	if err := c1.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c2.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("key set through one RedisURL is visible through the other (%d, %v)", n, err)
	}
}

func TestRedisURLOnExternalServer(t *testing.T) {
	ctx := context.Background()
	r := Redis(t)
	t.Setenv(EnvRedisURL, r.URL())
	server := redisConnect(t, r.URL())
	// A leftover of an earlier run must be flushed.
	if err := redisConnect(t, strings.TrimSuffix(r.URL(), "/0")+"/1").Set(ctx, "leftover", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}

	var urls []string
	t.Run("lease", func(t *testing.T) {
		u1, u2 := RedisURL(t), RedisURL(t)
		urls = []string{u1, u2}
		if u1 == u2 {
			t.Fatalf("RedisURL returned %s twice", u1)
		}
		for _, u := range urls {
			if strings.HasSuffix(u, "/0") {
				t.Errorf("RedisURL() = %s: DB 0 holds the leases and is never handed out", u)
			}
		}
		c1 := redisConnect(t, u1)
		if err := c1.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, u := range urls {
			if n, _ := redisConnect(t, u).Exists(ctx, "leftover").Result(); n != 0 {
				t.Errorf("leased database %s was not flushed", u)
			}
		}
		if n, _ := redisConnect(t, u2).Exists(ctx, "k").Result(); n != 0 {
			t.Error("key visible in the other leased database")
		}
		if n, _ := server.Keys(ctx, leaseKeyPrefix+"*").Result(); len(n) != 2 {
			t.Errorf("lease keys = %v, want 2", n)
		}
	})
	if keys, _ := server.Keys(ctx, leaseKeyPrefix+"*").Result(); len(keys) != 0 {
		t.Errorf("leases %v not released after the test", keys)
	}
	for _, u := range urls {
		if n, _ := redisConnect(t, u).DBSize(ctx).Result(); n != 0 {
			t.Errorf("database %s holds %d keys after its test", u, n)
		}
	}
}

func TestWithPath(t *testing.T) {
	got, err := withPath("postgres://u:secret@h:5432/postgres?sslmode=disable", "/test_1")
	if err != nil || got != "postgres://u:secret@h:5432/test_1?sslmode=disable" {
		t.Errorf("withPath = %q, %v", got, err)
	}
	_, err = withPath("host=h user=u password=secret", "/x")
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("withPath(keyword/value) error = %v, want one without the password", err)
	}
}

func TestDatabaseParallel(t *testing.T) {
	for i := range 8 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			conn := pgConnect(t, Database(t))
			if _, err := conn.Exec(context.Background(), "CREATE TABLE t (id int)"); err != nil {
				t.Fatal(err)
			}
			RedisURL(t)
		})
	}
}

func TestPostgresHint(t *testing.T) {
	missing := fmt.Errorf("start postgres: %w", servers.ErrPostgresVersionMissing)
	if got := postgresHint(missing); got != "" {
		t.Errorf("postgresHint(version missing) = %q, want \"\": the error names the fetch command", got)
	}
	noBinaries := fmt.Errorf("start postgres: %w", servers.ErrNoPostgres)
	if got := postgresHint(noBinaries); !strings.Contains(got, "apt-get install postgresql") {
		t.Errorf("postgresHint(no binaries) = %q, want the install hint", got)
	}
}
