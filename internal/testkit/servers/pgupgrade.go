package servers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// pgUpgradeNeeds are the programs pg_upgrade runs from the new cluster's
// bin directory, pg_upgrade itself included.
var pgUpgradeNeeds = []string{"pg_upgrade", "initdb", "postgres", "pg_ctl", "pg_controldata", "pg_resetwal",
	"pg_dump", "pg_dumpall", "pg_restore", "psql", "vacuumdb"}

// ErrNoPgUpgrade means that no bin directory holds pg_upgrade and the
// programs it runs for the major version asked for.
var ErrNoPgUpgrade = errors.New("pg_upgrade not available")

// PgUpgradeBin returns the local bin directory that holds pg_upgrade of
// exactly the given major version with every program it runs (Debian's
// postgresql-<major>, in /usr/lib/postgresql/<major>/bin). The cache of
// scripts/fetch-postgres.sh holds only initdb, postgres and pg_ctl, so it
// can be the old cluster of an upgrade, never the new one.
func PgUpgradeBin(major int) (string, error) {
	for _, dir := range localPostgresCandidates() {
		if !hasAll(dir, pgUpgradeNeeds) {
			continue
		}
		if v := postgresVersion(dir); v.err == nil && v.major == major {
			return dir, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL %d: %w: no local bin directory holds %v (Debian: apt-get install postgresql-%d)",
		major, ErrNoPgUpgrade, pgUpgradeNeeds, major)
}

// CachedPostgresBin returns the binaries of exactly major version major as
// WALCOUNT_TEST_PG=<major> selects them (the cache first, then the local
// ones), whatever WALCOUNT_TEST_PG says.
func CachedPostgresBin(major int) (PostgresBin, error) {
	cache := os.Getenv(EnvPGCache)
	if cache == "" {
		cache = DefaultPGCache
	}
	return selectPostgresBin(strconv.Itoa(major), cache, localPostgresCandidates())
}

func hasAll(dir string, names []string) bool {
	for _, n := range names {
		if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Upgrade upgrades p to the PostgreSQL of binDir (see PgUpgradeBin) as an
// operator does it with pg_upgrade: it stops p (fast), makes a new cluster
// with initdb, runs pg_upgrade (copy mode, its default) from p's data directory into it and
// starts the new cluster with p's settings on p's port. It returns the new
// cluster, which has a system identifier of its own; p stays stopped, its
// data directory intact (the caller still closes it).
//
// pg_upgrade runs pg_controldata from the old bin directory, which the
// cache lacks: the old binaries are then linked into a directory of their
// own beside the new pg_controldata, which reads the control file of every
// version that shares its format (14 and 15 do: pg_control version 1300).
func (p *Postgres) Upgrade(ctx context.Context, binDir string) (_ *Postgres, err error) {
	if err := p.Stop(ctx, StopFast); err != nil {
		return nil, fmt.Errorf("pg_upgrade: stop the old cluster: %w", err)
	}
	bin, err := describeBin(binDir, "")
	if err != nil {
		return nil, fmt.Errorf("pg_upgrade: %w", err)
	}
	n := &Postgres{binDir: binDir, major: bin.Major, id: p.id, port: p.Port(), logger: p.logger}
	defer func() {
		if err != nil {
			n.removeAll()
		}
	}()
	if err := n.prepareDirs(""); err != nil {
		return nil, fmt.Errorf("pg_upgrade: %w", err)
	}
	if err := initCluster(n.base, binDir, n.dataDir, n.id); err != nil {
		return nil, fmt.Errorf("pg_upgrade: create the new cluster: %w", err)
	}
	settings := maps.Clone(p.settings)
	settings["unix_socket_directories"] = n.socketDir
	if err := writeOwned(filepath.Join(n.dataDir, confFile), []byte(formatSettings(settings)), 0o600, n.id); err != nil {
		return nil, fmt.Errorf("pg_upgrade: %w", err)
	}
	n.settings = settings
	oldBin, err := n.oldBinDir(p.binDir)
	if err != nil {
		return nil, fmt.Errorf("pg_upgrade: %w", err)
	}
	oldPort, err := freePort()
	if err != nil {
		return nil, err
	}
	newPort, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pg_upgrade"),
		"--old-bindir", oldBin, "--new-bindir", binDir,
		"--old-datadir", p.dataDir, "--new-datadir", n.dataDir,
		"--old-port", strconv.Itoa(oldPort), "--new-port", strconv.Itoa(newPort),
		"--username", "postgres", "--socketdir", n.socketDir)
	cmd.Dir = n.base
	cmd.Env = serverEnv()
	cmd.SysProcAttr = sysProcAttr(n.id.cred, 0)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_upgrade: %w\n%s", err, lastLines(string(out), 40))
	}
	if err := n.Start(ctx); err != nil {
		return nil, fmt.Errorf("pg_upgrade: start the new cluster: %w", err)
	}
	return n, nil
}

// oldBinDir returns old when it holds what pg_upgrade runs from the old
// cluster's bin directory, else a directory of n's with links to old's
// postgres and pg_ctl, to the new pg_controldata and a pg_resetwal that
// runs the new one: pg_upgrade runs `pg_resetwal -n DATADIR` on the old
// cluster, which only reads its control file and lists its pg_wal, and the
// new pg_resetwal refuses another version's PG_VERSION. The script runs it
// on a directory that links the old cluster's global and pg_wal beside a
// PG_VERSION of the new version; -n writes nothing. -V says the old version.
func (n *Postgres) oldBinDir(old string) (string, error) {
	if hasAll(old, []string{"postgres", "pg_ctl", "pg_controldata", "pg_resetwal"}) {
		return old, nil
	}
	dir := filepath.Join(n.base, "oldbin")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	links := map[string]string{
		"postgres":       filepath.Join(old, "postgres"),
		"pg_ctl":         filepath.Join(old, "pg_ctl"),
		"pg_controldata": filepath.Join(n.binDir, "pg_controldata"),
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	script := fmt.Sprintf(`#!/bin/sh
# pg_upgrade runs "pg_resetwal -n DATADIR" on the old cluster (see oldBinDir).
set -e
if [ "$1" = -V ] || [ "$1" = --version ]; then
	%[3]q -V | sed 's/^postgres/pg_resetwal/'
	exit
fi
[ "$1" = -n ] || { echo "this pg_resetwal only runs -n and -V" >&2; exit 1; }
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
chmod 700 "$view"
ln -s "$2/global" "$view/global"
ln -s "$2/pg_wal" "$view/pg_wal"
echo %[1]d >"$view/PG_VERSION"
%[2]q -n "$view"
`, n.major, filepath.Join(n.binDir, "pg_resetwal"), filepath.Join(old, "postgres"))
	if err := os.WriteFile(filepath.Join(dir, "pg_resetwal"), []byte(script), 0o755); err != nil {
		return "", err
	}
	return dir, nil
}
