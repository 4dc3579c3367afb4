package servers

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// MinPostgresVersion is the oldest PostgreSQL major version walcount supports.
const MinPostgresVersion = 14

var (
	// ErrNoPostgres means that no usable PostgreSQL server binaries were found.
	ErrNoPostgres = errors.New("no PostgreSQL >= 14 server binaries (initdb, postgres, pg_ctl) found in PATH, " +
		"`pg_config --bindir` or /usr/lib/postgresql/*/bin; walcount tests need PostgreSQL >= 14 server binaries: " +
		"install them with `apt-get install postgresql`")
	// ErrNoRedis means that no redis-server binary was found.
	ErrNoRedis = errors.New("no redis-server binary found in PATH, /usr/bin or /usr/local/bin: " +
		"install it with `apt-get install redis-server`")
)

// postgresBins are the programs a PostgreSQL bin directory must hold.
var postgresBins = []string{"initdb", "postgres", "pg_ctl"}

// versionCache remembers `postgres --version` per bin directory: it is asked
// for every cluster and costs a process start.
var versionCache sync.Map // bin dir -> versionInfo

type versionInfo struct {
	major   int
	version string // major.minor, such as "17.10"
	full    string // the whole output of postgres --version
	err     error
}

var versionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)(\.\d+)?`)

// FindPostgresBin returns the directory that holds the PostgreSQL server
// binaries initdb, postgres and pg_ctl, of a version >= MinPostgresVersion.
// It looks, in order, in PATH, in `pg_config --bindir` and in
// /usr/lib/postgresql/*/bin (highest version first). The error wraps
// ErrNoPostgres and says what to install.
//
// When WALCOUNT_TEST_PG names a major version, the binaries of exactly that
// version are returned instead, as SelectPostgres describes.
func FindPostgresBin() (string, error) {
	b, err := SelectPostgres()
	if err != nil {
		return "", err
	}
	return b.Dir, nil
}

// localPostgresCandidates lists the directories the search of the local
// binaries looks at, in order of preference.
func localPostgresCandidates() []string {
	var candidates []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	candidates = append(candidates, debianBinDirs()...)
	return candidates
}

// findPostgresBinIn returns the first candidate directory that holds
// PostgreSQL server binaries of a supported version.
func findPostgresBinIn(candidates []string) (string, error) {
	return findPostgresMajorIn(candidates, 0)
}

// findPostgresMajorIn returns the first candidate directory that holds
// PostgreSQL server binaries of a supported version and, unless major is 0,
// of exactly that major version. Directories of other supported versions are
// skipped without complaint: with several Debian versions installed, they
// are expected.
func findPostgresMajorIn(candidates []string, major int) (string, error) {
	var rejected []string
	for _, dir := range candidates {
		if !hasPostgresBins(dir) {
			continue
		}
		v := postgresVersion(dir)
		if v.err != nil {
			rejected = append(rejected, fmt.Sprintf("%s: %v", dir, v.err))
			continue
		}
		if v.major < MinPostgresVersion {
			rejected = append(rejected, fmt.Sprintf("%s: version %d is too old", dir, v.major))
			continue
		}
		if major != 0 && v.major != major {
			rejected = append(rejected, fmt.Sprintf("%s: version %d", dir, v.major))
			continue
		}
		return dir, nil
	}
	if len(rejected) > 0 {
		return "", fmt.Errorf("find postgres binaries: %w (rejected: %s)", ErrNoPostgres, strings.Join(rejected, "; "))
	}
	return "", fmt.Errorf("find postgres binaries: %w", ErrNoPostgres)
}

// debianBinDirs lists /usr/lib/postgresql/<version>/bin, highest version first.
func debianBinDirs() []string {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool {
		return dirVersion(matches[i]) > dirVersion(matches[j])
	})
	return matches
}

// dirVersion reads the version out of /usr/lib/postgresql/<version>/bin.
func dirVersion(binDir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	if err != nil {
		return -1
	}
	return v
}

// hasPostgresBins reports whether dir holds every program in postgresBins.
func hasPostgresBins(dir string) bool {
	for _, name := range postgresBins {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// postgresVersion runs `postgres --version` in binDir, once per directory.
func postgresVersion(binDir string) versionInfo {
	if v, ok := versionCache.Load(binDir); ok {
		return v.(versionInfo)
	}
	var v versionInfo
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		v.err = fmt.Errorf("run postgres --version: %w", err)
	} else {
		v.full = strings.TrimSpace(string(out))
		m := versionRE.FindStringSubmatch(v.full)
		if m == nil {
			v.err = fmt.Errorf("parse postgres version %q: unrecognised format", v.full)
		} else {
			v.major, _ = strconv.Atoi(m[1])
			v.version = m[1] + m[2]
		}
	}
	versionCache.Store(binDir, v)
	return v
}

// findRedisBin returns the path of redis-server.
func findRedisBin() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("find redis-server: %w", ErrNoRedis)
}

// findRedisCLI returns the redis-cli next to redis-server, or the one in
// PATH.
func findRedisCLI() (string, error) {
	if srv, err := findRedisBin(); err == nil {
		p := filepath.Join(filepath.Dir(srv), "redis-cli")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("redis-cli"); err == nil {
		return p, nil
	}
	return "", errors.New("find redis-cli: not next to redis-server nor in PATH: " +
		"install it with `apt-get install redis-tools`")
}
