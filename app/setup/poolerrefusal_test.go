package setup_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/operator"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// setupThroughPooler runs setup as walcount setup does with database_url
// at the pooler (pooled) and replication_url direct, and returns its error.
func setupThroughPooler(t *testing.T, f *fixture, pooled, direct string) error {
	t.Helper()
	ctx := context.Background()
	opt := f.opts(likes)
	opt.Config.DatabaseURL, opt.Config.ReplicationURL = pooled, direct
	conn, err := opt.Config.ConnectSQL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	slotConn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer slotConn.Close(ctx)
	opt.SlotConn = slotConn
	_, err = setup.Run(ctx, conn, opt)
	return err
}

// poolerFinding runs the checks of walcount check and returns the pooler
// finding; it fails the test unless the gate refuses it as a problem of
// the configuration (check and run exit 2).
func poolerFinding(t *testing.T, f *fixture, pooled, direct string) preflight.Finding {
	t.Helper()
	cfg := f.opts(likes).Config
	cfg.DatabaseURL, cfg.ReplicationURL = pooled, direct
	findings, err := preflight.Run(context.Background(), preflight.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	var ref *preflight.Refusal
	if err := preflight.Gate(findings); !errors.As(err, &ref) || ref.Unreachable() {
		t.Errorf("the checks pass the pooler: %v", err)
	}
	for _, fd := range findings {
		if fd.Check == preflight.CheckPooler && fd.Severity == preflight.Problem {
			if fd.Cause != preflight.CauseConfig {
				t.Errorf("pooler problem %q has cause %v, want the configuration's", fd.Message, fd.Cause)
			}
			return fd
		}
	}
	t.Fatalf("no %s problem among %+v", preflight.CheckPooler, findings)
	return preflight.Finding{}
}

// nothingCreated fails the test if setup left a slot or a publication.
func nothingCreated(t *testing.T, f *fixture, conns ...*pgx.Conn) {
	t.Helper()
	for _, c := range append(conns, f.conn) {
		var slots, pubs int
		if err := c.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1), (SELECT count(*) FROM pg_publication WHERE pubname = 'walcount')`, f.slot).Scan(&slots, &pubs); err != nil {
			t.Fatal(err)
		}
		if slots != 0 || pubs != 0 {
			t.Errorf("setup refused but left %d slots and %d publications", slots, pubs)
		}
	}
}

// TestPgBouncerStatementMode puts database_url at a PgBouncer pool in
// statement mode. check used to pass it while run could never flush
// ("transaction blocks not allowed in statement pooling mode"), and setup
// failed with that raw error. Now check refuses it as a configuration
// problem with the fix, and setup refuses with the same before creating
// anything.
func TestPgBouncerStatementMode(t *testing.T) {
	t.Parallel()
	direct := testenv.Database(t)
	f := newFixture(t, direct)
	pooled := pgbouncerWith(t, direct, servers.PgBouncerOptions{PoolMode: "statement"})

	fd := poolerFinding(t, f, pooled, direct)
	if !strings.Contains(fd.Message, "statement mode") || !strings.Contains(fd.Fix, "pool_mode = transaction") {
		t.Errorf("statement pool: %+v, want it named with the fix", fd)
	}
	err := setupThroughPooler(t, f, pooled, direct)
	if err == nil || !strings.Contains(err.Error(), "pool_mode = transaction") {
		t.Fatalf("setup through a statement pool: %v, want a refusal with the fix", err)
	}
	t.Logf("setup: %v", err)
	nothingCreated(t, f)
}

// TestPoolerRoutesToAnotherDatabase puts database_url at a PgBouncer alias
// that routes to another database of the same server than replication_url
// connects to; both databases have the app's tables. setup used to exit 0
// with the publication and the state in one database and the slot in the
// other. Now check and setup refuse it, naming both databases.
func TestPoolerRoutesToAnotherDatabase(t *testing.T) {
	t.Parallel()
	direct, other := testenv.Database(t), testenv.Database(t)
	f := newFixture(t, direct)
	g := newFixture(t, other)
	du, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	ou, err := url.Parse(other)
	if err != nil {
		t.Fatal(err)
	}
	name, otherName := strings.TrimPrefix(du.Path, "/"), strings.TrimPrefix(ou.Path, "/")
	pooled := pgbouncerWith(t, direct, servers.PgBouncerOptions{PoolMode: "transaction", Aliases: map[string]string{name: otherName}})

	fd := poolerFinding(t, f, pooled, direct)
	if !strings.Contains(fd.Message, "database "+otherName) || !strings.Contains(fd.Message, "database "+name) || !strings.Contains(fd.Fix, "same database") {
		t.Errorf("pooler routing to another database: %+v, want both named with the fix", fd)
	}
	err = setupThroughPooler(t, f, pooled, direct)
	if err == nil || !strings.Contains(err.Error(), "same database") {
		t.Fatalf("setup with the two URLs in two databases: %v, want a refusal with the fix", err)
	}
	t.Logf("setup: %v", err)
	nothingCreated(t, f, g.conn)

	// The same pooler with an alias that routes right passes.
	good := pgbouncer(t, direct)
	if err := setupThroughPooler(t, f, good, direct); err != nil {
		t.Errorf("setup through a pooler that routes to replication_url's database: %v", err)
	}
}

// TestRunSkipCheckStatementMode runs the daemon itself (walcount run
// --skip-check) with database_url at a statement-mode pool, after a setup
// made directly: every session used to fail on its first transaction and
// be retried for good. It now stops at once with the fix, as an error that
// needs an operator.
func TestRunSkipCheckStatementMode(t *testing.T) {
	t.Parallel()
	direct := testenv.Database(t)
	f := newFixture(t, direct)
	f.run(t, f.opts(likes))
	pooled := pgbouncerWith(t, direct, servers.PgBouncerOptions{PoolMode: "statement"})
	cfg := f.opts(likes).Config
	cfg.DatabaseURL, cfg.ReplicationURL = pooled, direct
	d, err := daemon.New(daemon.Options{Config: cfg, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = d.Run(ctx)
	if err == nil || !operator.Needed(err) || !strings.Contains(err.Error(), "pool_mode = transaction") {
		t.Fatalf("run at a statement pool: %v, want a stop that needs an operator, with the fix", err)
	}
	t.Logf("run: %v", err)
}
