package setup_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/golden"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestPrintSQLGolden holds what walcount setup --print-sql
// --fix-replica-identity prints for golden's representative configuration
// (a counter of each kind) to files in testdata, at three moments of one
// database:
//
//   - print_sql_fresh: nothing set up yet, printed for a walcount role of
//     its own (LOGIN REPLICATION, no privilege on the tables);
//   - print_sql_new_counter: set up without tag_posts, which the
//     configuration then gains (the publication and an identity change);
//   - print_sql_set_up: set up as configured (nothing to do).
//
// When --print-sql fails, the file ends with the error, as a comment the
// test adds: print_sql_fresh does today, because --print-sql prints no
// via table and so finds user_karma's walcount.via_user_karma missing. The statements differ between PostgreSQL versions (the
// publication's options, the slot's), hence a file per major version
// (.pg<major>.sql). The role, the database and the slot, which vary
// between runs, are replaced by placeholders (the superuser, who owns the
// tables and runs the later phases, is <role>). Run it with -update to
// rewrite the files, and review their diff.
func TestPrintSQLGolden(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testenv.Database(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, golden.RepresentativeSchema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	var role, db string
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_user::text, current_database()::text, current_setting('server_version_num')::int").Scan(&role, &db, &version); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(golden.RepresentativeConfig), "walcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DatabaseURL, cfg.RedisURL = url, testenv.RedisURL(t)
	cfg.Slot = fmt.Sprintf("golden_%d_%d", os.Getpid(), slotSeq.Add(1))
	norm := golden.Replacer{
		golden.Literal(cfg.Slot, "<slot>"),
		golden.Literal(db, "<database>"),
		golden.Literal(role, "<role>"),
	}
	// walcount's own role, for the first phase; roles are cluster-wide.
	walcountRole := fmt.Sprintf("golden_walcount_%d_%d", os.Getpid(), slotSeq.Add(1))
	if _, err := conn.Exec(ctx, "CREATE ROLE "+walcountRole+" LOGIN REPLICATION"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+walcountRole) })
	walcountConn, err := pgx.Connect(ctx, withUser(t, url, walcountRole))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { walcountConn.Close(context.Background()) })
	norm = append(norm, golden.Literal(walcountRole, "<walcount_role>"))

	check := func(conn *pgx.Conn, name string) {
		t.Helper()
		var out bytes.Buffer
		opt := setup.Options{Config: cfg, PrintSQL: true, FixReplicaIdentity: true, Out: &out}
		if _, err := setup.Run(ctx, conn, opt); err != nil {
			fmt.Fprintf(&out, "\n-- (added by the test) walcount setup --print-sql fails: %v\n", err)
		}
		golden.Check(t, fmt.Sprintf("%s.pg%d.sql", name, version/10000), []byte(norm.Apply(out.String())))
	}
	run := func(counters []counter.Counter) {
		t.Helper()
		c := cfg
		c.Counters = counters
		if _, err := setup.Run(ctx, conn, setup.Options{Config: c, FixReplicaIdentity: true}); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}

	check(walcountConn, "print_sql_fresh")
	var without []counter.Counter
	for _, c := range cfg.Counters {
		if c.Name != "tag_posts" {
			without = append(without, c)
		}
	}
	if len(without) != len(cfg.Counters)-1 {
		t.Fatalf("the representative configuration has no counter tag_posts")
	}
	run(without)
	check(conn, "print_sql_new_counter")
	run(cfg.Counters)
	check(conn, "print_sql_set_up")
}
