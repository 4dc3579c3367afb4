package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestSetupAndTeardownAsWalcountsRole: the commands as a role that has
// REPLICATION and owns none of the app's tables. setup stops at the
// publication naming the owner's step and --print-sql (exit 1); the SQL it
// prints runs as the owner; setup then finishes and check passes; teardown
// drops what the role owns and prints the rest for the owner (exit 0).
func TestSetupAndTeardownAsWalcountsRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.Database(t)
	c := newCLI(t, dbURL, goodSchema)
	n := slotSeq.Add(1)
	owner, role := fmt.Sprintf("cli_owner_%d_%d", os.Getpid(), n), fmt.Sprintf("cli_walcount_%d_%d", os.Getpid(), n)
	var db string
	if err := c.conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	dbID := pgx.Identifier{db}.Sanitize()
	for _, sql := range []string{
		"CREATE ROLE " + owner + " LOGIN", "CREATE ROLE " + role + " LOGIN REPLICATION",
		"GRANT CREATE ON DATABASE " + dbID + " TO " + owner + ", " + role, "GRANT " + role + " TO " + owner,
		"ALTER TABLE likes OWNER TO " + owner, "ALTER TABLE posts OWNER TO " + owner,
	} {
		if _, err := c.conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		for _, r := range []string{role, owner} {
			_, _ = c.conn.Exec(context.Background(), "DROP OWNED BY "+r+" CASCADE")
		}
		_, _ = c.conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", c.slot)
		for _, r := range []string{role, owner} {
			_, _ = c.conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
		}
	})
	c.db = strings.Replace(dbURL, "postgres@", role+"@", 1)
	if _, err := c.conn.Exec(ctx, "GRANT SELECT ON likes TO "+role+"; GRANT SELECT, UPDATE (likes_count) ON posts TO "+role); err != nil {
		t.Fatal(err)
	}

	code, out := c.run("setup")
	if code != exitFailure || !strings.Contains(out, "needs the owner of") || !strings.Contains(out, "--print-sql") {
		t.Fatalf("setup as walcount's role before the owner's SQL: exit %d, want %d naming the owner's step and --print-sql", code, exitFailure)
	}
	code, sql := c.run("setup", "--print-sql")
	if code != exitOK || strings.Contains(sql, ";;") {
		t.Fatalf("setup --print-sql: exit %d", code)
	}
	ownerConn, err := pgx.Connect(ctx, strings.Replace(dbURL, "postgres@", owner+"@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer ownerConn.Close(ctx)
	if _, err := ownerConn.Exec(ctx, sql); err != nil {
		t.Fatalf("the owner runs the printed SQL: %v\n%s", err, sql)
	}
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup after the owner's SQL: exit %d", code)
	}
	code, out = c.run("check")
	if code != exitOK || !strings.Contains(out, "steps that need the owner of the tables") {
		t.Fatalf("check after setup: exit %d", code)
	}

	if _, err := c.conn.Exec(ctx, "ALTER PUBLICATION walcount OWNER TO "+owner); err != nil {
		t.Fatal(err)
	}
	code, out = c.run("teardown", "--yes")
	if code != exitOK || !strings.Contains(out, "left for their owner") || !strings.Contains(out, `DROP PUBLICATION IF EXISTS "walcount";`) {
		t.Fatalf("teardown --yes as walcount's role with the owner's publication: exit %d", code)
	}
	if n := c.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", c.slot) + c.count("SELECT count(*) FROM pg_namespace WHERE nspname = 'walcount'"); n != 0 {
		t.Errorf("teardown left the slot or the schema (%d)", n)
	}
}

// TestSetupThroughPgBouncer: the commands with database_url on PgBouncer in
// transaction mode and the slot's replication_url direct; check names the
// pooler when the replication URL points at it.
func TestSetupThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.Database(t)
	c := newCLI(t, direct, goodSchema)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	b, err := servers.StartPgBouncer(ctx, servers.PgBouncerOptions{Host: u.Hostname(), Port: port, Users: []string{u.User.Username()}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pooled := b.URL(u.User.Username(), strings.TrimPrefix(u.Path, "/"))
	c.db = pooled
	for _, cmd := range []string{"setup", "check"} {
		if code, _ := c.run(cmd, "--replication-url", direct+"&replication=database"); code != exitOK {
			t.Fatalf("%s through the pooler with a direct replication URL: exit %d", cmd, code)
		}
	}
	if n := c.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", c.slot); n != 1 {
		t.Fatalf("setup made %d slots", n)
	}
	// The same without replication_url: database_url is the pooler, so
	// is the replication connection; check's own connection works through
	// the pooler and says so.
	code, out := c.run("check")
	if code != exitFailure || !strings.Contains(out, "connection pooler") || !strings.Contains(out, "replication_url") {
		t.Fatalf("check with database_url at the pooler and no replication URL: exit %d, want %d naming the pooler and the fix", code, exitFailure)
	}
	code, out = c.run("check", "--replication-url", pooled)
	if code != exitFailure || !strings.Contains(out, "connection pooler") || !strings.Contains(out, "replication_url") {
		t.Fatalf("check with the replication URL at the pooler: exit %d, want %d naming the pooler and the fix", code, exitFailure)
	}
	if code, _ := c.run("teardown", "--yes", "--replication-url", direct); code != exitOK {
		t.Fatalf("teardown: exit %d", code)
	}
}
