package servers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// templateHBA is the pg_hba.conf of every cluster: trust on the local socket
// and on 127.0.0.1, replication connections included.
const templateHBA = `# Written by walcount's internal/servers: throwaway test clusters trust local users.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 trust
host    all          all   127.0.0.1/32  trust
local   replication  all                 trust
host    replication  all   127.0.0.1/32  trust
`

// confInclude is appended to the template's postgresql.conf. Each cluster
// writes its own settings into confFile, so that they can be rewritten at
// every StartPostgres without the main file growing.
const (
	confFile    = "walcount.conf"
	confInclude = "\n# walcount's internal/servers writes its settings here.\ninclude_if_exists = '" + confFile + "'\n"
)

// templates caches the template data directory per key within this process;
// the file lock in ensureTemplate guards it across processes.
var templates sync.Map // key -> string

// templateDataDir returns a data directory made by initdb for the binaries in
// binDir and owned by id, creating it on first use. It lives under
// os.TempDir() and is shared by every process of the same user and version.
func templateDataDir(binDir string, id identity) (string, error) {
	v := postgresVersion(binDir)
	if v.err != nil {
		return "", fmt.Errorf("create template cluster: %w", v.err)
	}
	// The key covers the bin directory and the full version string, so that
	// the versions WALCOUNT_TEST_PG selects (each in its own directory) and
	// an upgraded package never share a template.
	sum := sha256.Sum256([]byte(binDir + "\x00" + v.full + "\x00" + strconv.Itoa(id.uid) + "\x00" + templateHBA + confInclude))
	key := hex.EncodeToString(sum[:6])
	if dir, ok := templates.Load(key); ok {
		return dir.(string), nil
	}
	root := filepath.Join(os.TempDir(), fmt.Sprintf("walcount-pgtemplate-%d-%s", os.Geteuid(), key))
	data, err := ensureTemplate(root, binDir, id)
	if err != nil {
		return "", fmt.Errorf("create template cluster in %s: %w", root, err)
	}
	templates.Store(key, data)
	return data, nil
}

// ensureTemplate runs initdb into root/data unless root/ready says a previous
// run completed. An exclusive flock on root/lock serialises the processes of
// a parallel `go test ./...`.
func ensureTemplate(root, binDir string, id identity) (string, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("create directory: %w", err)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return "", fmt.Errorf("stat directory: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || (ok && int(st.Uid) != os.Geteuid()) {
		return "", fmt.Errorf("check directory: %s is not a directory owned by uid %d", root, os.Geteuid())
	}
	// Others (the postgres user) must be able to traverse it.
	if err := os.Chmod(root, 0o755); err != nil {
		return "", fmt.Errorf("chmod directory: %w", err)
	}

	lock, err := os.OpenFile(filepath.Join(root, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", fmt.Errorf("open lock file: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock template: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // Close releases it anyway.

	data := filepath.Join(root, "data")
	ready := filepath.Join(root, "ready")
	if _, err := os.Stat(ready); err == nil {
		if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
			return data, nil
		}
	}

	// A previous attempt failed half way, or never ran: start afresh.
	if err := os.RemoveAll(data); err != nil {
		return "", fmt.Errorf("remove stale template: %w", err)
	}
	if err := initCluster(root, binDir, data, id); err != nil {
		return "", err
	}
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		return "", fmt.Errorf("mark template ready: %w", err)
	}
	return data, nil
}

// writeOwned atomically replaces the file at path with b, owned by id.
func writeOwned(path string, b []byte, perm os.FileMode, id identity) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, perm); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := id.chown(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("replace %s: %w", filepath.Base(path), err)
	}
	return nil
}

// copyDir copies the directory src to dst (which must not exist) with
// `cp -a`, keeping owners and modes.
func copyDir(src, dst string) error {
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, out)
	}
	return nil
}

// initCluster runs initdb into data (which must not exist), run from dir,
// and prepares the cluster as the template is: walcount's pg_hba.conf and
// the include of the file StartPostgres writes its settings to.
func initCluster(dir, binDir, data string, id identity) error {
	if err := os.Mkdir(data, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	if err := id.chown(data); err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(binDir, "initdb"),
		"-D", data, "--auth=trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C")
	cmd.Dir = dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: id.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("run initdb: %w\n%s", err, out)
	}
	if err := writeOwned(filepath.Join(data, "pg_hba.conf"), []byte(templateHBA), 0o600, id); err != nil {
		return err
	}
	conf, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open postgresql.conf: %w", err)
	}
	if _, err := conf.WriteString(confInclude); err != nil {
		conf.Close()
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	if err := conf.Close(); err != nil {
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	return nil
}
