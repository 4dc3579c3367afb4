package servers

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// RedisOptions configures StartRedis. The zero value is valid.
type RedisOptions struct {
	// Port is the TCP port on 127.0.0.1. 0 means a random free port.
	Port int
	// Logger receives start and stop events. nil means no logging.
	Logger *zap.Logger
}

// Redis is a redis-server process started by StartRedis, with persistence
// off. Its methods are safe for concurrent use.
type Redis struct {
	bin     string
	dir     string // working directory and log; removed by Close
	logPath string
	logger  *zap.Logger

	mu     sync.Mutex
	port   int
	proc   *process // nil while stopped
	closed bool
}

// StartRedis starts a redis-server on 127.0.0.1 and waits until it answers
// PING. ctx bounds the start; with no deadline, DefaultStartTimeout applies.
func StartRedis(ctx context.Context, opt RedisOptions) (_ *Redis, err error) {
	bin, err := findRedisBin()
	if err != nil {
		return nil, fmt.Errorf("start redis: %w", err)
	}
	dir, err := makeTempDir("walcount-redis-")
	if err != nil {
		return nil, fmt.Errorf("start redis: %w", err)
	}
	r := &Redis{bin: bin, dir: dir, logPath: filepath.Join(dir, "redis.log"), port: opt.Port, logger: opt.Logger}
	if r.logger == nil {
		r.logger = zap.NewNop()
	}
	if err := r.Start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

// Start starts the stopped (killed) server again on the same port and waits
// until it answers PING. It comes back empty: nothing is persisted.
func (r *Redis) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := startable("redis", r.closed, r.proc); err != nil {
		return err
	}
	r.proc = nil
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	began := time.Now()
	if err := retryPort(ctx, &r.port, "redis", r.logger, r.startOnce); err != nil {
		return fmt.Errorf("start redis: %w", err)
	}
	r.logger.Info("redis started", zap.Int(logKeyPort, r.port), zap.Duration(logKeyTook, time.Since(began)))
	return nil
}

// startOnce runs redis-server on r.port and waits for PONG.
func (r *Redis) startOnce(ctx context.Context) error {
	logOffset := fileSize(r.logPath)
	args := []string{
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", r.dir,
		"--daemonize", "no",
		"--logfile", "",
	}
	proc, err := startProcess(r.bin, args, r.dir, r.logPath, identity{}, syscall.SIGKILL)
	if err != nil {
		return err
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if redisPing(r.port) {
			r.proc = proc
			return nil
		}
		select {
		case <-proc.done:
			out := readFrom(r.logPath, logOffset)
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("bind 127.0.0.1:%d: %w", r.port, errPortInUse)
			}
			return fmt.Errorf("redis-server exited during startup (%v); log:\n%s", proc.err, lastLines(out, 20))
		case <-ctx.Done():
			proc.killGroup()
			<-proc.done
			return fmt.Errorf("wait for redis on port %d: %w; log:\n%s",
				r.port, ctx.Err(), lastLines(readFrom(r.logPath, logOffset), 20))
		case <-ticker.C:
		}
	}
}

// redisPing reports whether a server on the port answers PING with PONG
// (it answers -LOADING while it is not ready).
func redisPing(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.TrimSpace(line) == "+PONG"
}

// Kill kills the server with SIGKILL, losing everything it held, and waits
// until it has exited. Killing a stopped server returns nil.
func (r *Redis) Kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("kill redis: %w", ErrClosed)
	}
	if r.proc == nil {
		return nil
	}
	if err := r.proc.signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill redis: %w", err)
	}
	<-r.proc.done
	r.proc = nil
	r.logger.Info("redis killed", zap.Int(logKeyPort, r.port))
	return nil
}

// Running reports whether the server is running.
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc.running()
}

// PID returns the server's process id, or 0 while it is stopped.
func (r *Redis) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc.pid()
}

// Close kills the server and removes its directory. It is idempotent.
func (r *Redis) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if r.proc != nil {
		r.proc.killGroup()
		<-r.proc.done
		r.proc = nil
	}
	if err := os.RemoveAll(r.dir); err != nil {
		return fmt.Errorf("close redis: %w", err)
	}
	return nil
}

// Port returns the TCP port the server listens on.
func (r *Redis) Port() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.port
}

// Addr returns the server's address, 127.0.0.1:PORT.
func (r *Redis) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port()))
}

// URL returns redis://127.0.0.1:PORT/0.
func (r *Redis) URL() string {
	return "redis://" + r.Addr() + "/0"
}

// LogTail returns the last n lines of the server log, for failure messages.
func (r *Redis) LogTail(n int) string {
	return tailFile(r.logPath, n)
}

// LogPath returns the path of the server's log file.
func (r *Redis) LogPath() string { return r.logPath }
