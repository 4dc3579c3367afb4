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
// test adds. The statements differ between PostgreSQL versions (the
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

// TestPrintedSQLSetsUpARoleOfItsOwn: what --print-sql prints for a
// walcount role with no privilege on the tables, run as the tables' owner,
// lets that role's walcount setup finish, for golden's representative
// configuration (a counter through a parent among them: its via table is
// printed, created as walcount's role, and published).
func TestPrintedSQLSetsUpARoleOfItsOwn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testenv.Database(t)
	owner, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { owner.Close(context.Background()) })
	if _, err := owner.Exec(ctx, golden.RepresentativeSchema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	cfg, err := config.Parse([]byte(golden.RepresentativeConfig), "walcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DatabaseURL, cfg.RedisURL = url, testenv.RedisURL(t)
	cfg.Slot = fmt.Sprintf("printed_%d_%d", os.Getpid(), slotSeq.Add(1))
	role := fmt.Sprintf("printed_walcount_%d_%d", os.Getpid(), slotSeq.Add(1))
	if _, err := owner.Exec(ctx, "CREATE ROLE "+role+" LOGIN REPLICATION"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot)
	})
	walcount, err := pgx.Connect(ctx, withUser(t, url, role))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { walcount.Close(context.Background()) })
	var sql bytes.Buffer
	if _, err := setup.Run(ctx, walcount, setup.Options{Config: cfg, PrintSQL: true, FixReplicaIdentity: true, Out: &sql}); err != nil {
		t.Fatalf("setup --print-sql: %v\n%s", err, sql.String())
	}
	// The database owner's session: membership in walcount's role, as the
	// printed groups need.
	if _, err := owner.Exec(ctx, "GRANT "+role+" TO current_user; GRANT CREATE ON DATABASE "+pgx.Identifier{dbName(t, owner)}.Sanitize()+" TO "+role); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, sql.String()); err != nil {
		t.Fatalf("the printed SQL, run as the owner: %v\n%s", err, sql.String())
	}
	if _, err := setup.Run(ctx, walcount, setup.Options{Config: cfg}); err != nil {
		t.Fatalf("walcount setup as its role after the printed SQL: %v", err)
	}
	var published bool
	if err := owner.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = 'walcount' AND tablename = 'via_user_karma')`, cfg.Publication).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if !published {
		t.Errorf("walcount.via_user_karma is not in publication %s", cfg.Publication)
	}
}

func dbName(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var db string
	if err := conn.QueryRow(context.Background(), "SELECT current_database()::text").Scan(&db); err != nil {
		t.Fatal(err)
	}
	return db
}
