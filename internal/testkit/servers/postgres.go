package servers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Shutdown modes accepted by Postgres.Stop; they mean what pg_ctl -m means.
const (
	// StopSmart waits for every client to disconnect, then shuts down.
	StopSmart = "smart"
	// StopFast disconnects clients, writes a checkpoint and shuts down.
	StopFast = "fast"
	// StopImmediate quits without a checkpoint; the next start runs crash
	// recovery.
	StopImmediate = "immediate"
)

// Timing of server starts and stops.
const (
	// DefaultStartTimeout bounds a start when the caller's context has no
	// deadline. Crash recovery after an immediate stop counts against it.
	DefaultStartTimeout = 60 * time.Second
	// closeTimeout bounds the immediate shutdown in Close before SIGKILL.
	closeTimeout = 10 * time.Second
	// pollInterval is how often a starting server is checked for readiness.
	pollInterval = 5 * time.Millisecond
	// portAttempts is how many random ports a start tries before it gives
	// up: another process can take a port between freePort and bind.
	portAttempts = 5
)

// Log field keys.
const (
	logKeyPort = "port"
	logKeyDir  = "dir"
	logKeyMode = "mode"
	logKeyTook = "took_seconds"
)

var (
	// ErrClosed is returned by methods called after Close.
	ErrClosed = errors.New("server closed")
	// ErrRunning is returned by Start when the server already runs.
	ErrRunning = errors.New("server already running")
	// errPortInUse means the server could not bind its port.
	errPortInUse = errors.New("port already in use")
)

// settingNameRE is what a postgresql.conf parameter name looks like.
var settingNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// PostgresOptions configures StartPostgres. The zero value is valid.
type PostgresOptions struct {
	// Dir is the directory that holds the cluster: its data directory
	// (Dir/data), its log file and its Unix socket. "" means a new temporary
	// directory under TempRoot(), removed by Close. A Dir that already holds
	// a cluster made by this package is started as it is; Close leaves a
	// given Dir in place.
	Dir string
	// Port is the TCP port on 127.0.0.1. 0 means a random free port.
	Port int
	// Settings are postgresql.conf parameters that override the defaults
	// (see DefaultPostgresSettings), e.g. {"max_slot_wal_keep_size": "64MB"}.
	Settings map[string]string
	// Logger receives start and stop events. nil means no logging.
	Logger *zap.Logger
	// TLS, when set, turns TLS on with the server certificate and key of
	// these files (made by MakeTLSFiles) and its CA as ssl_ca_file, and makes
	// every TCP connection use TLS: pg_hba.conf then has hostssl lines only,
	// and URL returns sslmode=verify-full URLs that trust TLS.CAFile. The
	// files are copied into the data directory, owned by the server's user,
	// because PostgreSQL refuses a key that another user owns or can read.
	TLS *TLSFiles
	// OwnSystem runs initdb for the new cluster instead of copying the
	// cached template, so that it has a system identifier of its own:
	// every cluster copied from the template shares the template's, as
	// standbys of one primary do. It costs an initdb (a second or two).
	OwnSystem bool
	// BinDir holds the binaries to run (initdb, postgres, pg_ctl). ""
	// means those SelectPostgres selects.
	BinDir string
}

// DefaultPostgresSettings returns the settings every cluster starts with,
// before PostgresOptions.Settings. fsync stays on: crash tests need committed
// data to survive an immediate shutdown.
func DefaultPostgresSettings() map[string]string {
	return map[string]string{
		"wal_level":             "logical",
		"max_replication_slots": "20",
		"max_wal_senders":       "20",
		"max_connections":       "100",
		"shared_buffers":        "32MB",
		"listen_addresses":      "127.0.0.1",
		"fsync":                 "on",
		"huge_pages":            "off",
		"logging_collector":     "off",
		"log_line_prefix":       "%m [%p] %q%u@%d ",
		"log_timezone":          "UTC",
		"timezone":              "UTC",
	}
}

// Postgres is a PostgreSQL cluster started by StartPostgres. Its methods are
// safe for concurrent use; Stop, Start and Close serialise.
type Postgres struct {
	binDir     string
	major      int               // major version of the binaries
	settings   map[string]string // what walcount.conf holds, socket directory included
	tls        *TLSFiles         // the caller's files, for URL; nil without TLS
	standby    *standbyInfo      // nil unless made by StartStandby
	base       string            // holds data/, the log file and the socket
	dataDir    string
	logPath    string
	socketDir  string
	removeDirs []string // removed by Close
	id         identity
	logger     *zap.Logger

	mu     sync.Mutex
	port   int
	proc   *process // nil while stopped
	closed bool
}

// StartPostgres creates a cluster (a copy of a cached initdb template) and
// starts it, waiting until it accepts connections. ctx bounds the start; with
// no deadline, DefaultStartTimeout applies.
func StartPostgres(ctx context.Context, opt PostgresOptions) (_ *Postgres, err error) {
	settings := DefaultPostgresSettings()
	for k, v := range opt.Settings {
		if !settingNameRE.MatchString(k) {
			return nil, fmt.Errorf("start postgres: invalid setting name %q", k)
		}
		settings[k] = v
	}
	bin, err := SelectPostgres()
	if opt.BinDir != "" {
		bin, err = describeBin(opt.BinDir, "")
	}
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	binDir := bin.Dir
	id, err := postgresIdentity()
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	p := &Postgres{binDir: binDir, major: bin.Major, id: id, port: opt.Port, logger: opt.Logger}
	if p.logger == nil {
		p.logger = zap.NewNop()
	}
	defer func() {
		if err != nil {
			p.removeAll()
		}
	}()
	if err := p.prepareDirs(opt.Dir); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if _, err := os.Stat(filepath.Join(p.dataDir, "PG_VERSION")); err != nil && opt.OwnSystem {
		if err := initCluster(p.base, binDir, p.dataDir, id); err != nil {
			return nil, fmt.Errorf("start postgres: create cluster: %w", err)
		}
	} else if err != nil {
		tmpl, err := templateDataDir(binDir, id)
		if err != nil {
			return nil, fmt.Errorf("start postgres: %w", err)
		}
		if err := copyDir(tmpl, p.dataDir); err != nil {
			return nil, fmt.Errorf("start postgres: create cluster: %w", err)
		}
	}
	if err := p.writeHBA(opt.TLS, settings); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	settings["unix_socket_directories"] = p.socketDir
	if err := writeOwned(filepath.Join(p.dataDir, confFile), []byte(formatSettings(settings)), 0o600, id); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	p.settings = settings
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// prepareDirs creates the base directory (a new temporary one when dir is
// "") and a short socket directory, owned by the server's user.
func (p *Postgres) prepareDirs(dir string) error {
	if dir == "" {
		base, err := makeTempDir("walcount-pg-")
		if err != nil {
			return err
		}
		p.base = base
		p.removeDirs = append(p.removeDirs, base)
	} else {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("resolve dir: %w", err)
		}
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return fmt.Errorf("create dir: %w", err)
		}
		p.base = abs
	}
	if err := p.id.chown(p.base); err != nil {
		return err
	}
	if err := p.id.checkReachable(filepath.Join(p.base, "data")); err != nil {
		return err
	}
	p.dataDir = filepath.Join(p.base, "data")
	p.logPath = filepath.Join(p.base, "postgres.log")

	// A Unix socket path is limited to 107 bytes; "/.s.PGSQL.65535" takes 15.
	p.socketDir = p.base
	if len(p.base) > 80 || strings.ContainsAny(p.base, " ,'\\") {
		sock, err := makeTempDir("wcpgs-")
		if err != nil {
			return err
		}
		p.removeDirs = append(p.removeDirs, sock)
		if err := p.id.chown(sock); err != nil {
			return err
		}
		p.socketDir = sock
	}
	return nil
}

// formatSettings renders settings as postgresql.conf lines, sorted by name.
func formatSettings(settings map[string]string) string {
	var b strings.Builder
	b.WriteString("# Written by walcount's internal/servers at every start; do not edit.\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = %s\n", k, quoteSetting(settings[k]))
	}
	return b.String()
}

// quoteSetting quotes a value the way ALTER SYSTEM does: single quotes, with
// quotes and backslashes doubled. Every parameter type accepts this form.
func quoteSetting(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	v = strings.ReplaceAll(v, `'`, `''`)
	return "'" + v + "'"
}

// Start starts the stopped cluster again, on the same port and data
// directory, and waits until it accepts connections (after crash recovery,
// if the last stop was immediate). ctx bounds the wait; with no deadline,
// DefaultStartTimeout applies.
func (p *Postgres) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := startable("postgres", p.closed, p.proc); err != nil {
		return err
	}
	p.proc = nil
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	began := time.Now()
	if err := retryPort(ctx, &p.port, "postgres", p.logger, p.startOnce); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p.logger.Info("postgres started", zap.Int(logKeyPort, p.port),
		zap.String(logKeyDir, p.base), zap.Duration(logKeyTook, time.Since(began)))
	return nil
}

// startOnce runs the postmaster on p.port and waits for it to be ready. On
// failure the process is gone and the error carries the log's tail.
func (p *Postgres) startOnce(ctx context.Context) error {
	logOffset := fileSize(p.logPath)
	proc, err := startProcess(filepath.Join(p.binDir, "postgres"),
		[]string{"-D", p.dataDir, "-p", strconv.Itoa(p.port)},
		p.base, p.logPath, p.id, syscall.SIGQUIT)
	if err != nil {
		return err
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if postmasterReady(p.dataDir, proc.cmd.Process.Pid) && dialable(p.port) {
			p.proc = proc
			return nil
		}
		select {
		case <-proc.done:
			out := readFrom(p.logPath, logOffset)
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("bind 127.0.0.1:%d: %w", p.port, errPortInUse)
			}
			return fmt.Errorf("postgres exited during startup (%v); log:\n%s", proc.err, lastLines(out, 20))
		case <-ctx.Done():
			_ = proc.signal(syscall.SIGQUIT)
			waitCtx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			defer cancel()
			if proc.wait(waitCtx) != nil {
				proc.killGroup()
			}
			return fmt.Errorf("wait for postgres on port %d: %w; log:\n%s",
				p.port, ctx.Err(), lastLines(readFrom(p.logPath, logOffset), 20))
		case <-ticker.C:
		}
	}
}

// postmasterReady reports whether postmaster.pid names pid and says "ready",
// which is what pg_ctl waits for. Its 8th line is the postmaster status
// (https://www.postgresql.org/docs/current/storage-file-layout.html).
func postmasterReady(dataDir string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 || strings.TrimSpace(lines[0]) != strconv.Itoa(pid) {
		return false
	}
	return strings.TrimSpace(lines[7]) == "ready"
}

// dialable reports whether something accepts TCP connections on the port.
func dialable(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Stop shuts the cluster down in the given mode (StopSmart, StopFast or
// StopImmediate, as pg_ctl -m) and waits until the postmaster has exited. A
// stopped cluster stays stopped and returns nil.
func (p *Postgres) Stop(ctx context.Context, mode string) error {
	var sig syscall.Signal
	switch mode {
	case StopSmart:
		sig = syscall.SIGTERM
	case StopFast:
		sig = syscall.SIGINT
	case StopImmediate:
		sig = syscall.SIGQUIT
	default:
		return fmt.Errorf("stop postgres: unknown mode %q (want smart, fast or immediate)", mode)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("stop postgres: %w", ErrClosed)
	}
	if p.proc == nil {
		return nil
	}
	began := time.Now()
	if err := p.proc.signal(sig); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	if err := p.proc.wait(ctx); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	p.proc = nil
	p.logger.Info("postgres stopped", zap.Int(logKeyPort, p.port), zap.String(logKeyMode, mode),
		zap.Duration(logKeyTook, time.Since(began)))
	return nil
}

// Running reports whether the postmaster is running.
func (p *Postgres) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc.running()
}

// PID returns the postmaster's process id, or 0 while it is stopped.
func (p *Postgres) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc.pid()
}

// SetSettings writes the settings into postgresql.auto.conf, as ALTER SYSTEM
// would: they override every other file and take effect at the next Start
// (or at a reload, for those that allow it). Use it for what a test must
// change on an existing cluster, such as wal_level=replica or
// max_slot_wal_keep_size.
func (p *Postgres) SetSettings(ctx context.Context, settings map[string]string) error {
	for k := range settings {
		if !settingNameRE.MatchString(k) {
			return fmt.Errorf("set postgres settings: invalid setting name %q", k)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set postgres settings: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("set postgres settings: %w", ErrClosed)
	}
	path := filepath.Join(p.dataDir, "postgresql.auto.conf")
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("set postgres settings: read postgresql.auto.conf: %w", err)
	}
	out := rewriteAutoConf(string(old), settings)
	if err := writeOwned(path, []byte(out), 0o600, p.id); err != nil {
		return fmt.Errorf("set postgres settings: %w", err)
	}
	return nil
}

// rewriteAutoConf replaces the lines of the given settings in the content of
// a postgresql.auto.conf and appends those that are new, sorted by name.
func rewriteAutoConf(old string, settings map[string]string) string {
	var lines []string
	if strings.TrimSpace(old) == "" {
		lines = []string{
			"# Do not edit this file manually!",
			"# It will be overwritten by the ALTER SYSTEM command.",
		}
	} else {
		lines = strings.Split(strings.TrimRight(old, "\n"), "\n")
	}
	done := make(map[string]bool, len(settings))
	for i, line := range lines {
		name, _, ok := strings.Cut(line, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		for k, v := range settings {
			if strings.ToLower(k) == name {
				lines[i] = k + " = " + quoteSetting(v)
				done[k] = true
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		if !done[k] {
			lines = append(lines, k+" = "+quoteSetting(settings[k]))
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// Close stops the cluster immediately (SIGKILL if that takes longer than
// 10 s) and removes the directories StartPostgres created. It is idempotent.
func (p *Postgres) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if p.proc != nil {
		if err := p.proc.signal(syscall.SIGQUIT); err != nil {
			errs = append(errs, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		if p.proc.wait(ctx) != nil {
			p.proc.killGroup()
			<-p.proc.done
		}
		cancel()
		p.proc = nil
	}
	if err := p.removeAll(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close postgres: %w", err)
	}
	return nil
}

// removeAll removes the directories this Postgres created.
func (p *Postgres) removeAll() error {
	var errs []error
	for _, d := range p.removeDirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	p.removeDirs = nil
	return errors.Join(errs...)
}

// Port returns the TCP port the cluster listens on.
func (p *Postgres) Port() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.port
}

// URL returns the URL of the postgres database as the postgres superuser,
// without a password: postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable,
// or, for a cluster started with TLS, with
// sslmode=verify-full&sslrootcert=<TLS.CAFile> instead.
func (p *Postgres) URL() string {
	return p.DatabaseURL("postgres")
}

// DatabaseURL returns the URL of the named database, as URL does.
func (p *Postgres) DatabaseURL(db string) string {
	q := url.Values{"sslmode": {"disable"}}
	if p.tls != nil {
		q = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {p.tls.CAFile}}
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port())),
		Path:     "/" + db,
		RawQuery: q.Encode(),
	}
	return u.String()
}

// Major returns the major version of the cluster's binaries, such as 17.
func (p *Postgres) Major() int { return p.major }

// DataDir returns the cluster's data directory.
func (p *Postgres) DataDir() string { return p.dataDir }

// LogPath returns the path of the server's log file.
func (p *Postgres) LogPath() string { return p.logPath }

// LogTail returns the last n lines of the server log, for failure messages.
func (p *Postgres) LogTail(n int) string {
	return tailFile(p.logPath, n)
}
