package setup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// psqlPath finds psql: next to the server binaries the tests run, else in
// PATH (the npm builds of other versions carry no psql; a newer client
// talks to every supported server).
func psqlPath(t *testing.T) string {
	t.Helper()
	if dir, err := servers.FindPostgresBin(); err == nil {
		if p := filepath.Join(dir, "psql"); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("psql")
	if err != nil {
		t.Fatalf("psql not found next to the PostgreSQL binaries nor in PATH (apt-get install postgresql-client): %v", err)
	}
	return p
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// withUser is url with its user replaced.
func withUser(t *testing.T, url, user string) string {
	t.Helper()
	if !strings.Contains(url, "postgres@") {
		t.Fatalf("database url %s does not name user postgres", url)
	}
	return strings.Replace(url, "postgres@", user+"@", 1)
}

// threeRoles is a database whose app tables belong to an owner role, and
// walcount's own role with REPLICATION and nothing else: what a superuser
// makes once, before handing over.
type threeRoles struct {
	super          *pgx.Conn
	owner, walcnt  string // role names
	ownerURL, wURL string
	ownerConn      *pgx.Conn
}

func newThreeRoles(t *testing.T) *threeRoles {
	t.Helper()
	ctx := context.Background()
	dbURL := testenv.Database(t)
	super, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { super.Close(context.Background()) })
	n := slotSeq.Add(1)
	r := &threeRoles{super: super,
		owner:  fmt.Sprintf("app_owner_%d_%d", os.Getpid(), n),
		walcnt: fmt.Sprintf("walcount_role_%d_%d", os.Getpid(), n)}
	var db string
	if err := super.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	dbID := pgx.Identifier{db}.Sanitize()
	// The superuser only makes the roles and what they may do in the
	// database; everything else is done as the owner or as walcount's role.
	for _, sql := range []string{
		"CREATE ROLE " + r.owner + " LOGIN",
		"CREATE ROLE " + r.walcnt + " LOGIN REPLICATION",
		"GRANT CREATE ON DATABASE " + dbID + " TO " + r.owner,
		"GRANT CREATE ON SCHEMA public TO " + r.owner,
		"GRANT CREATE ON DATABASE " + dbID + " TO " + r.walcnt,
		"GRANT " + r.walcnt + " TO " + r.owner,
	} {
		if _, err := super.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		// The database is dropped by testenv; the roles are cluster-wide.
		for _, role := range []string{r.walcnt, r.owner} {
			_, _ = super.Exec(context.Background(), "DROP OWNED BY "+role+" CASCADE")
		}
		_, _ = super.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'roles_%' AND NOT active AND database = current_database()")
		for _, role := range []string{r.walcnt, r.owner} {
			_, _ = super.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		}
	})
	r.ownerURL, r.wURL = withUser(t, dbURL, r.owner), withUser(t, dbURL, r.walcnt)
	if r.ownerConn, err = pgx.Connect(ctx, r.ownerURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ownerConn.Close(context.Background()) })
	// The app's migration, as the owner.
	if _, err := r.ownerConn.Exec(ctx, appschema.SQL(appschema.Options{DefaultIdentity: true, Posts: 20})+`
INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 100) g;`); err != nil {
		t.Fatal(err)
	}
	return r
}

// psql runs sql through psql -v ON_ERROR_STOP=1 as the owner.
func (r *threeRoles) psql(t *testing.T, sql string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "owner.sql")
	if err := os.WriteFile(f, []byte(sql), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(psqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-d", r.ownerURL, "-f", f)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql as the owner failed: %v\n%s\nSQL:\n%s", err, out, sql)
	}
	return string(out)
}

func (r *threeRoles) config(t *testing.T) config.Config {
	cfg := config.Default()
	cfg.DatabaseURL, cfg.RedisURL = r.wURL, testenv.RedisURL(t)
	cfg.Slot = fmt.Sprintf("roles_%d_%d", os.Getpid(), slotSeq.Add(1))
	cfg.FlushInterval = 100 * time.Millisecond
	return cfg
}

func (r *threeRoles) walcountConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), r.wURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestThreeRoles runs the whole path of a least-privilege deployment: a
// superuser makes the roles, the tables' owner runs the output of setup
// --print-sql through psql, and walcount's role (REPLICATION, no
// ownership of the tables) runs setup, run (exact under load) and
// teardown.
func TestThreeRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newThreeRoles(t)
	cfg := r.config(t)
	wconn := r.walcountConn(t)

	// The owner runs what --print-sql prints, as is.
	var out bytes.Buffer
	if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg, PrintSQL: true, Out: &out, FixReplicaIdentity: true}); err != nil {
		t.Fatalf("setup --print-sql: %v", err)
	}
	sql := out.String()
	t.Logf("setup --print-sql as %s:\n%s", r.walcnt, sql)
	for _, bad := range []string{");;", "FOR TABLE ;", ";;"} {
		if strings.Contains(sql, bad) {
			t.Errorf("--print-sql output holds %q", bad)
		}
	}
	for _, want := range []string{"Needs: ", "walcount.messages", "OWNER TO " + pgx.Identifier{r.walcnt}.Sanitize(), "GRANT SELECT ON \"public\".\"likes\" TO"} {
		if !strings.Contains(sql, want) {
			t.Errorf("--print-sql output lacks %q", want)
		}
	}
	r.psql(t, sql)

	// walcount's role does the rest, and again (idempotent: the
	// publication the owner made matches and is left alone).
	for i := range 2 {
		res, err := setup.Run(ctx, wconn, setup.Options{Config: cfg})
		if err != nil {
			t.Fatalf("setup #%d as walcount's role after the owner's SQL: %v", i+1, err)
		}
		if i == 0 && !res.CreatedSlot {
			t.Fatal("setup did not create the slot")
		}
	}
	if got := query(t, r.super, "SELECT pubowner::regrole::text FROM pg_publication WHERE pubname = 'walcount'"); got != r.walcnt {
		t.Errorf("publication owner = %s, want walcount's role %s", got, r.walcnt)
	}
	if got := query(t, r.super, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'walcount'"); got != r.walcnt {
		t.Errorf("schema walcount owner = %s, want walcount's role %s", got, r.walcnt)
	}

	// walcount run's gate lets walcount's role start.
	findings, err := preflight.Run(ctx, preflight.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if err := preflight.Gate(findings); err != nil {
		t.Fatalf("run would refuse walcount's role after the three-role setup: %v", err)
	}
	for _, f := range findings {
		if f.Check == preflight.CheckOwnerSteps && f.Severity != preflight.OK {
			t.Errorf("owner steps once the owner made the publication: %+v", f)
		}
	}

	// Run, as walcount's role, under load from the app (the owner).
	d, err := daemon.New(daemon.Options{Config: cfg, RetryMin: 50 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("walcount run as walcount's role: %v", err)
			}
			d.Close()
		}
	}
	defer stop()
	for i := range 30 {
		if _, err := r.ownerConn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + (g * 7 + $1) % 20 FROM generate_series(1, 10) g`, i); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ownerConn.Exec(ctx, `DELETE FROM likes WHERE id IN (SELECT id FROM likes ORDER BY random() LIMIT 4)`); err != nil {
			t.Fatal(err)
		}
	}
	waitExact(t, r.ownerConn)
	stop()

	// Teardown as walcount's role: it owns all it made, so it drops all.
	tres, err := setup.Teardown(ctx, wconn, nil, cfg.Slot, cfg.Publication)
	if err != nil {
		t.Fatalf("teardown as walcount's role: %v", err)
	}
	if len(tres.ForOwner) > 0 {
		t.Errorf("teardown left %v for the owner", tres.ForOwner)
	}
	for what, sql := range map[string]string{
		"slot":        "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '" + cfg.Slot + "'",
		"publication": "SELECT count(*)::text FROM pg_publication WHERE pubname = 'walcount'",
		"schema":      "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'",
	} {
		if n := query(t, r.super, sql); n != "0" {
			t.Errorf("%s left after teardown", what)
		}
	}
}

// TestSetupNeedsTheOwner: walcount's role, granted what it reads and
// writes but owning none of the tables, is told which step needs the
// owner and how the owner runs it: for the replica identity fix (nothing
// is left behind) and for the publication (the state schema is made, as
// walcount's role, and no slot: pgoutput could not decode the changes
// made before the publication).
func TestSetupNeedsTheOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newThreeRoles(t)
	cfg := r.config(t)
	wconn := r.walcountConn(t)
	if _, err := r.ownerConn.Exec(ctx, "GRANT SELECT ON likes TO "+r.walcnt+"; GRANT SELECT, UPDATE (likes_count) ON posts TO "+r.walcnt); err != nil {
		t.Fatal(err)
	}

	// check says up front that the publication needs the owner, and that
	// the owner must be a member of walcount's role.
	ownerSteps := func() preflight.Finding {
		t.Helper()
		findings, err := preflight.Run(ctx, preflight.Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range findings {
			if f.Check == preflight.CheckOwnerSteps {
				return f
			}
		}
		t.Fatalf("no %s finding in %v", preflight.CheckOwnerSteps, findings)
		return preflight.Finding{}
	}
	if _, err := r.super.Exec(ctx, "REVOKE "+r.walcnt+" FROM "+r.owner); err != nil {
		t.Fatal(err)
	}
	f := ownerSteps()
	if f.Severity != preflight.Warning || !strings.Contains(f.Message, "public.likes (owned by "+r.owner+")") ||
		!strings.Contains(f.Message, "role "+r.walcnt+" is not the owner of public.likes, public.posts:") ||
		!strings.Contains(f.Fix, "GRANT "+r.walcnt+" TO "+r.owner+";") || !strings.Contains(f.Fix, "--print-sql") {
		t.Errorf("owner steps before the owner's membership: %+v", f)
	}
	if _, err := r.super.Exec(ctx, "GRANT "+r.walcnt+" TO "+r.owner); err != nil {
		t.Fatal(err)
	}
	if f := ownerSteps(); f.Severity != preflight.Warning || strings.Contains(f.Fix, "GRANT") || !strings.Contains(f.Fix, "--print-sql") {
		t.Errorf("owner steps once the owner is a member: %+v", f)
	}

	_, err := setup.Run(ctx, wconn, setup.Options{Config: cfg, FixReplicaIdentity: true})
	var owner *setup.OwnerNeededError
	if !errors.As(err, &owner) || !strings.Contains(err.Error(), "REPLICA IDENTITY FULL") || !strings.Contains(err.Error(), "--print-sql --fix-replica-identity") {
		t.Fatalf("setup --fix-replica-identity as walcount's role: err = %v, want the owner's step named with --print-sql --fix-replica-identity", err)
	}
	if n := query(t, r.super, "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'"); n != "0" {
		t.Error("a refused setup left the state schema")
	}

	if _, err := r.ownerConn.Exec(ctx, "ALTER TABLE likes REPLICA IDENTITY FULL"); err != nil {
		t.Fatal(err)
	}
	_, err = setup.Run(ctx, wconn, setup.Options{Config: cfg})
	if !errors.As(err, &owner) || !strings.Contains(err.Error(), "CREATE PUBLICATION") || !strings.Contains(err.Error(), "--print-sql") ||
		!strings.Contains(err.Error(), `"public"."likes"`) {
		t.Fatalf("setup as walcount's role without the publication: err = %v, want the owner's step named with --print-sql", err)
	}
	if n := query(t, r.super, "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot); n != "0" {
		t.Error("setup created the slot without the publication")
	}
	if got := query(t, r.super, "SELECT coalesce((SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'walcount'), '')"); got != r.walcnt {
		t.Errorf("schema walcount owner = %q, want walcount's role %s", got, r.walcnt)
	}

	// The owner runs what --print-sql prints; the state schema exists now,
	// so it is not printed again.
	var out bytes.Buffer
	if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg, PrintSQL: true, Out: &out}); err != nil {
		t.Fatalf("setup --print-sql: %v", err)
	}
	if strings.Contains(out.String(), "CREATE TABLE") || strings.Contains(out.String(), "GRANT") {
		t.Errorf("--print-sql prints what exists:\n%s", out.String())
	}
	r.psql(t, out.String())
	if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg}); err != nil {
		t.Fatalf("setup after the owner's SQL: %v", err)
	}

	// A publication the owner keeps is printed by teardown, not dropped,
	// and teardown drops the rest.
	if _, err := r.super.Exec(ctx, "ALTER PUBLICATION walcount OWNER TO "+r.owner); err != nil {
		t.Fatal(err)
	}
	tres, err := setup.Teardown(ctx, wconn, nil, cfg.Slot, cfg.Publication)
	if err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if len(tres.ForOwner) != 1 || tres.ForOwner[0] != `DROP PUBLICATION IF EXISTS "walcount";` {
		t.Errorf("teardown left for the owner %q, want the DROP PUBLICATION", tres.ForOwner)
	}
	r.psql(t, strings.Join(tres.ForOwner, "\n"))
	for what, sql := range map[string]string{
		"slot":        "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '" + cfg.Slot + "'",
		"publication": "SELECT count(*)::text FROM pg_publication WHERE pubname = 'walcount'",
		"schema":      "SELECT count(*)::text FROM pg_namespace WHERE nspname = 'walcount'",
	} {
		if n := query(t, r.super, sql); n != "0" {
			t.Errorf("%s left after teardown and the owner's SQL", what)
		}
	}
}

// waitExact waits until every post's likes_count is its number of likes.
func waitExact(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var off string
	if wait.Until(2*time.Minute, 100*time.Millisecond, func() bool {
		off = query(t, conn, `SELECT count(*)::text FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)`)
		return off == "0"
	}) {
		return
	}
	t.Fatalf("%s posts still off after 2 minutes", off)
}

func query(t *testing.T, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// TestPrintSQLWithoutTheTables: before the app's migration made the
// tables, --print-sql says they are missing instead of printing an invalid
// CREATE PUBLICATION, fails, and what it prints still runs.
func TestPrintSQLWithoutTheTables(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testenv.Database(t))
	f.exec(t, "DROP TABLE likes")
	var out bytes.Buffer
	opt := f.opts(likes)
	opt.PrintSQL, opt.Out = true, &out
	_, err := setup.Run(context.Background(), f.conn, opt)
	if err == nil || !strings.Contains(err.Error(), `"public"."likes" does not exist`) {
		t.Errorf("setup --print-sql without the source: err = %v, want it named", err)
	}
	got := out.String()
	if strings.Contains(got, "CREATE PUBLICATION") || !strings.Contains(got, `NOT PRINTED, because "public"."likes" does not exist`) {
		t.Errorf("setup --print-sql without the source:\n%s", got)
	}
	if strings.Contains(got, ";;") {
		t.Errorf("output holds ;;:\n%s", got)
	}
}
