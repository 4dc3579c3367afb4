package servers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"
)

// serverUser is the OS user that PostgreSQL runs as when the Go process is
// root, because postgres and initdb refuse to run as root.
const serverUser = "postgres"

// identity says which OS user a server process runs as. The zero value means
// "as this process".
type identity struct {
	cred *syscall.Credential // nil: no change
	uid  int
	gid  int
}

// postgresIdentity returns the identity PostgreSQL must run as: this
// process's own, or the postgres OS user when this process is root.
func postgresIdentity() (identity, error) {
	if os.Geteuid() != 0 {
		return identity{uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := user.Lookup(serverUser)
	if err != nil {
		return identity{}, fmt.Errorf("look up OS user %q (PostgreSQL refuses to run as root; "+
			"`apt-get install postgresql` creates that user): %w", serverUser, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return identity{}, fmt.Errorf("parse uid of %q: %w", serverUser, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return identity{}, fmt.Errorf("parse gid of %q: %w", serverUser, err)
	}
	return identity{
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
		uid:  uid,
		gid:  gid,
	}, nil
}

// chown gives path to the identity, when it is not this process.
func (id identity) chown(path string) error {
	if id.cred == nil {
		return nil
	}
	if err := os.Chown(path, id.uid, id.gid); err != nil {
		return fmt.Errorf("chown %s: %w", path, err)
	}
	return nil
}

// checkReachable verifies that the identity can traverse every ancestor of
// dir, so that a server running as another user can reach its files.
func (id identity) checkReachable(dir string) error {
	if id.cred == nil {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", dir, err)
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		canTraverse := mode&0o001 != 0 ||
			(ok && int(st.Uid) == id.uid && mode&0o100 != 0) ||
			(ok && int(st.Gid) == id.gid && mode&0o010 != 0)
		if !canTraverse {
			return fmt.Errorf("check directory %s: OS user %q cannot traverse %s (mode %v); "+
				"use a directory under %s", dir, serverUser, p, mode, os.TempDir())
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// process is one running server process whose output goes to a log file.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	err  error         // the result of cmd.Wait, valid after done
}

// startProcess starts bin with args in dir, appending stdout and stderr to
// logPath. The process gets its own process group (a terminal's Ctrl-C does
// not reach it directly) and deathSig when the Go process dies.
func startProcess(bin string, args []string, dir, logPath string, id identity, deathSig syscall.Signal) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log file: %w", err)
	}
	// The child inherits the descriptor; ours is not needed after Start.
	defer logFile.Close()

	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = serverEnv()
	cmd.SysProcAttr = sysProcAttr(id.cred, deathSig)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// serverEnv is the environment of server processes: a minimal one, so that
// PG* variables or a locale of the caller do not leak into the servers.
func serverEnv() []string {
	env := []string{"LC_ALL=C", "LANG=C"}
	if path := os.Getenv("PATH"); path != "" {
		env = append(env, "PATH="+path)
	}
	return env
}

// startable is the guard of a server's Start: it fails with ErrClosed
// for a server that was closed and with ErrRunning for one whose process
// still runs. what names the server in the error.
func startable(what string, closed bool, proc *process) error {
	if closed {
		return fmt.Errorf("start %s: %w", what, ErrClosed)
	}
	if proc != nil && !proc.exited() {
		return fmt.Errorf("start %s: %w", what, ErrRunning)
	}
	return nil
}

// withStartTimeout gives ctx DefaultStartTimeout when it has no deadline.
func withStartTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultStartTimeout)
}

// running reports whether p is a process that has not exited; a nil p
// (a server stopped) is not running.
func (p *process) running() bool { return p != nil && !p.exited() }

// pid returns p's process id, or 0 when it is not running.
func (p *process) pid() int {
	if !p.running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process; it is a no-op once the process exited.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal process %d: %w", p.cmd.Process.Pid, err)
	}
	return nil
}

// killGroup sends SIGKILL to the process's whole process group, which
// catches children that outlived their parent.
func (p *process) killGroup() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// wait waits until the process has exited or ctx is done.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for process %d: %w", p.cmd.Process.Pid, ctx.Err())
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another process
// may take it before the server binds it; callers retry on a collision.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick free port: %w", err)
	}
	return port, nil
}

// maxTailBytes bounds how much of a log file tailFile reads.
const maxTailBytes = 256 << 10

// tailFile returns the last n lines of the file at path, or "" if it cannot
// be read.
func tailFile(path string, n int) string {
	return lastLines(readFrom(path, -1), n)
}

// readFrom returns the file's content from offset on, or its last
// maxTailBytes when offset is negative.
func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if offset < 0 {
		offset = max(0, fi.Size()-maxTailBytes)
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxTailBytes))
	return string(b)
}

// lastLines returns the last n lines of s, without a trailing newline.
func lastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if n <= 0 || s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// fileSize returns the size of the file at path, 0 if it does not exist.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// retryPort runs startOnce on *port. A zero *port means any free port: one
// is picked, and picked again when another process takes it before the
// server binds it (up to portAttempts times); on failure *port is zero
// again. A fixed port is tried once.
func retryPort(ctx context.Context, port *int, name string, log *zap.Logger, startOnce func(context.Context) error) error {
	pickPort := *port == 0
	for attempt := 1; ; attempt++ {
		if pickPort {
			p, err := freePort()
			if err != nil {
				return err
			}
			*port = p
		}
		err := startOnce(ctx)
		if err == nil {
			return nil
		}
		if !pickPort || !errors.Is(err, errPortInUse) || attempt == portAttempts {
			if pickPort {
				*port = 0
			}
			return err
		}
		log.Debug(name+" port taken, retrying", zap.Int(logKeyPort, *port))
	}
}
