package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// The major versions of the pg_upgrade test: pg_upgrade runs from the new
// version's bin directory with every client program, which only Debian's
// postgresql-15 has here (the cache of the other versions holds initdb,
// postgres and pg_ctl).
const (
	pgUpgradeFrom = 14
	pgUpgradeTo   = 15
)

// upgradablePostgres starts a cluster of pgUpgradeFrom and returns it with
// the bin directory of pgUpgradeTo's pg_upgrade, or skips the test where
// either is missing, or with -short.
func upgradablePostgres(t *testing.T) (*servers.Postgres, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("a pg_upgrade takes half a minute")
	}
	old, err := servers.CachedPostgresBin(pgUpgradeFrom)
	if errors.Is(err, servers.ErrPostgresVersionMissing) {
		t.Skipf("no PostgreSQL %d: %v", pgUpgradeFrom, err)
	} else if err != nil {
		t.Fatal(err)
	}
	newBin, err := servers.PgUpgradeBin(pgUpgradeTo)
	if errors.Is(err, servers.ErrNoPgUpgrade) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := servers.StartPostgres(ctx, servers.PostgresOptions{BinDir: old.Dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, newBin
}

// TestPgUpgradeUnderWalcount upgrades the PostgreSQL under a walcount
// deployment with pg_upgrade, as docs/upgrade.md says: walcount is
// stopped (SIGTERM, as systemctl stop does), changes go on until
// PostgreSQL stops, pg_upgrade makes the new cluster (another system
// identifier, no logical slot before 17) on the same port, changes go on
// there, `walcount check` names the missing slot, `walcount setup` makes
// it anew and marks every counter dirty, and `walcount run` repairs them:
// every count exact.
func TestPgUpgradeUnderWalcount(t *testing.T) {
	t.Parallel()
	old, newBin := upgradablePostgres(t)
	db := old.DatabaseURL("postgres")
	c := &upgradeCLI{cli: newCLI(t, db, goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;"), addr: unusedAddr(t)}
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	c.firstRun(30) // stopped with SIGTERM
	c.like(7)      // while walcount is down: in the old cluster's WAL only
	c.conn.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := old.Upgrade(ctx, newBin)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c.conn = reconnect(t, db)
	c.like(9) // on the new cluster, before walcount runs

	code, out := c.run("check")
	if code != exitFailure || !strings.Contains(out, "PROBLEM replication slot "+c.slot+" does not exist — fix: walcount setup") {
		t.Errorf("check on the upgraded cluster: exit %d, want %d with the missing slot as its problem", code, exitFailure)
	}
	if strings.Count(out, "PROBLEM") != 1 {
		t.Errorf("check on the upgraded cluster has %d problems, want the missing slot only", strings.Count(out, "PROBLEM"))
	}
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	p := startWalcount(t, c.env("100ms"), "run")
	c.settlesExact(offPosts, "posts")
	poll(t, "the dirty marks to be repaired", func() (bool, string) {
		n := c.count(`SELECT count(*) FROM walcount.dirty`)
		return n == 0, fmt.Sprintf("%d dirty marks", n)
	})
	if code := p.stop(); code != exitOK {
		t.Errorf("walcount exited %d:\n%s", code, p.stderr.String())
	}
}

// reconnect opens the test's connection again, to a server that was
// replaced, and closes it at the test's end.
func reconnect(t *testing.T, db string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
