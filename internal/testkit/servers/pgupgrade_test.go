package servers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// upgradeFrom and upgradeTo are the major versions the pg_upgrade tests
// run: the newest version whose pg_upgrade is installed here (Debian's 15)
// and an older one of the cache.
const (
	upgradeFrom = 14
	upgradeTo   = 15
)

// pgUpgradeBins returns the old binaries and the new bin directory of a
// pg_upgrade from upgradeFrom to upgradeTo, or skips the test where they
// are missing.
func pgUpgradeBins(t *testing.T) (servers.PostgresBin, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("a pg_upgrade takes half a minute")
	}
	old, err := servers.CachedPostgresBin(upgradeFrom)
	if errors.Is(err, servers.ErrPostgresVersionMissing) {
		t.Skipf("no PostgreSQL %d: %v", upgradeFrom, err)
	} else if err != nil {
		t.Fatal(err)
	}
	newBin, err := servers.PgUpgradeBin(upgradeTo)
	if errors.Is(err, servers.ErrNoPgUpgrade) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	return old, newBin
}

// TestUpgrade runs pg_upgrade on a cluster with a table and a logical
// slot: the rows are there on the new version, on the same port, with
// another system identifier, and the slot is not (pg_upgrade before 17
// does not carry logical slots).
func TestUpgrade(t *testing.T) {
	t.Parallel()
	old, newBin := pgUpgradeBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := servers.StartPostgres(ctx, servers.PostgresOptions{BinDir: old.Dir})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Major() != upgradeFrom {
		t.Fatalf("started PostgreSQL %d, want %d", p.Major(), upgradeFrom)
	}
	conn := connect(t, p)
	mustExec(t, ctx, conn, `CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 100) g`)
	mustExec(t, ctx, conn, `SELECT pg_create_logical_replication_slot('s', 'pgoutput')`)
	var oldID string
	if err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&oldID); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	n, err := p.Upgrade(ctx, newBin)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Major() != upgradeTo || n.Port() != p.Port() {
		t.Errorf("upgraded to PostgreSQL %d on port %d, want %d on %d", n.Major(), n.Port(), upgradeTo, p.Port())
	}
	conn = connect(t, n)
	defer conn.Close(ctx)
	var rows, slots int
	var newID string
	err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM pg_replication_slots),
		(SELECT system_identifier::text FROM pg_control_system())`).Scan(&rows, &slots, &newID)
	if err != nil {
		t.Fatal(err)
	}
	if rows != 100 || slots != 0 || newID == oldID {
		t.Errorf("after pg_upgrade: %d rows (want 100), %d slots (want 0), system identifier %s (the old one %s)", rows, slots, newID, oldID)
	}
}
