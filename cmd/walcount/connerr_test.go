package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestConnectionErrors runs the real binary with URLs that cannot work
// and checks what it prints: the real cause with its fix, once, and where
// the URL came from.
func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	c := newCLI(t, pg.URL(), goodSchema)
	ctx := context.Background()
	// A role that must give its password over TCP; the server has no TLS,
	// so a URL without sslmode (libpq's prefer) tries TLS first.
	var hba string
	if err := c.conn.QueryRow(ctx, "SHOW hba_file").Scan(&hba); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE ROLE pwuser LOGIN SUPERUSER PASSWORD 'right'",
		fmt.Sprintf(`COPY (VALUES ('host all pwuser 127.0.0.1/32 scram-sha-256'), ('local all all trust'),
			('host all all 127.0.0.1/32 trust'), ('host replication all 127.0.0.1/32 trust')) TO '%s'`, hba),
		"SELECT pg_reload_conf()",
	} {
		if _, err := c.conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	wrongPassword := strings.Replace(strings.Replace(pg.URL(), "postgres@", "pwuser:wrong@", 1), "?sslmode=disable", "", 1)
	expect := func(t *testing.T, env []string, args []string, wantCode int, want []string, once string) {
		t.Helper()
		code, stdout, stderr := walcount(t, env, args...)
		out := stdout + stderr
		if code != wantCode {
			t.Errorf("walcount %s: exit %d, want %d", args[0], code, wantCode)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("walcount %s does not say %q", args[0], w)
			}
		}
		if strings.Contains(out, "tls error") || strings.Contains(out, "refused TLS") {
			t.Errorf("walcount %s prints the TLS fallback's error, a red herring", args[0])
		}
		if once != "" && strings.Count(out, once) != 1 {
			t.Errorf("walcount %s prints %q %d times, want once", args[0], once, strings.Count(out, once))
		}
		if strings.Contains(out, "wrong@") {
			t.Errorf("walcount %s prints the password", args[0])
		}
	}
	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		// A refused login only a person can fix: exit 2, which a
		// supervisor does not restart (run included).
		for _, cmd := range []string{"check", "status", "setup", "run"} {
			expect(t, nil, []string{cmd, "--database-url", wrongPassword, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", ""}, exitUsage,
				[]string{`password authentication failed for user "pwuser"`, "URL from flag --database-url", `fix: correct the user or password`, `ALTER ROLE "pwuser" PASSWORD`},
				"password authentication failed")
		}
	})
	t.Run("refused, from the environment", func(t *testing.T) {
		t.Parallel()
		env := []string{"WALCOUNT_DATABASE_URL=postgres://u@" + unusedAddr(t) + "/app"}
		// walcount run waits for a server that does not answer at start,
		// saying the same in its log (TestRunWaitsForServersAtStart).
		for _, cmd := range []string{"check", "status"} {
			expect(t, env, []string{cmd, "--redis-url", c.redis, "--http-addr", ""}, exitFailure,
				[]string{"URL from environment variable WALCOUNT_DATABASE_URL", "fix: start PostgreSQL, or correct the host and port"},
				"connection refused")
		}
	})
	t.Run("refused, from the file", func(t *testing.T) {
		t.Parallel()
		path := c.writeConfig("database_url: postgres://u@" + unusedAddr(t) + "/app\n")
		expect(t, nil, []string{"check", "--config", path, "--redis-url", c.redis}, exitFailure,
			[]string{"URL from config file " + path}, "connection refused")
	})
	t.Run("port not a number", func(t *testing.T) {
		t.Parallel()
		expect(t, nil, []string{"check", "--database-url", "postgres://u:secret@127.0.0.1:notaport/app", "--redis-url", c.redis}, exitUsage,
			[]string{"--database-url", `invalid port ":notaport": the port must be a number`}, "")
	})
	t.Run("redis database out of range", func(t *testing.T) {
		t.Parallel()
		redis := strings.TrimSuffix(c.redis, "/0") + "/99"
		code, stdout, _ := walcount(t, nil, "check", "--database-url", c.db, "--redis-url", redis, "--slot", c.slot)
		if code == exitOK || !strings.Contains(stdout, "has no database 99") || !strings.Contains(stdout, "use a database number below") {
			t.Errorf("check with Redis database 99: exit %d, want a finding that the database does not exist", code)
		}
		for _, line := range strings.Split(stdout, "\n") {
			if strings.Contains(line, "database 99") && strings.Contains(line, "start Redis") {
				t.Errorf("check tells to start a Redis that runs: %s", line)
			}
		}
	})
}
