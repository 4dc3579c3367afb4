package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/walcount/walcount/internal/testkit/wait"
)

// ErrNoPgBouncer means that no pgbouncer binary was found.
var ErrNoPgBouncer = errors.New("no pgbouncer binary found in PATH, /usr/sbin or /usr/bin: install it with `apt-get install pgbouncer` (scripts/ensure-deps.sh does)")

// PgBouncerOptions configures StartPgBouncer.
type PgBouncerOptions struct {
	// Host and Port are PostgreSQL's, which every database is pooled to.
	Host string
	Port int
	// PoolMode is session, transaction or statement; "" means transaction.
	PoolMode string
	// Aliases route a database name of the pooler to another database of
	// the server (alias → database), as a misconfigured [databases] line
	// does; every other name goes to the database of the same name.
	Aliases map[string]string
	// Users may connect (auth_type trust: PgBouncer logs them in to
	// PostgreSQL with no password, which the test clusters trust).
	Users []string
}

// PgBouncer is a pgbouncer process of its own, on a random port of
// 127.0.0.1, pooling every database of one PostgreSQL server.
type PgBouncer struct {
	dir  string
	port int
	proc *process
}

func findPgBouncerBin() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", ErrNoPgBouncer
}

// StartPgBouncer starts pgbouncer and waits until it accepts connections.
// It runs as the postgres OS user when this process is root (pgbouncer
// refuses root).
func StartPgBouncer(ctx context.Context, opt PgBouncerOptions) (*PgBouncer, error) {
	bin, err := findPgBouncerBin()
	if err != nil {
		return nil, err
	}
	if opt.PoolMode == "" {
		opt.PoolMode = "transaction"
	}
	if opt.Host == "" {
		opt.Host = "127.0.0.1"
	}
	id, err := postgresIdentity()
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("walcount-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{dir: dir}
	if err := id.chown(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := id.checkReachable(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var users strings.Builder
	for _, u := range opt.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		var aliases strings.Builder
		for alias, db := range opt.Aliases {
			fmt.Fprintf(&aliases, "%s = host=%s port=%d dbname=%s\n", alias, opt.Host, opt.Port, db)
		}
		ini := fmt.Sprintf(`[databases]
%s* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 200
default_pool_size = 10
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
`, aliases.String(), opt.Host, opt.Port, port, filepath.Join(dir, "users.txt"), opt.PoolMode)
		for name, content := range map[string]string{"pgbouncer.ini": ini, "users.txt": users.String()} {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
			if err := id.chown(p); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
		}
		logPath := filepath.Join(dir, "pgbouncer.log")
		proc, err := startProcess(bin, []string{filepath.Join(dir, "pgbouncer.ini")}, dir, logPath, id, syscall.SIGKILL)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		deadline, _ := ctx.Deadline()
		up := false
		wait.Until(time.Until(deadline), 10*time.Millisecond, func() bool {
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 100*time.Millisecond); err == nil {
				c.Close()
				up = true
				return true
			}
			return proc.exited() || ctx.Err() != nil
		})
		if up {
			b.port, b.proc = port, proc
			return b, nil
		}
		proc.killGroup()
		<-proc.done
		out := tailFile(logPath, 20)
		if ctx.Err() == nil && strings.Contains(out, "Address already in use") && attempt < portAttempts {
			continue
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start pgbouncer: exited or timed out (%v); log:\n%s", ctx.Err(), out)
	}
}

// URL is the URL of database db as user through the pooler.
func (b *PgBouncer) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, b.port, db)
}

// Port is the pooler's port.
func (b *PgBouncer) Port() int { return b.port }

// Close kills pgbouncer and removes its directory.
func (b *PgBouncer) Close() error {
	if b.proc != nil {
		b.proc.killGroup()
		<-b.proc.done
		b.proc = nil
	}
	return os.RemoveAll(b.dir)
}
