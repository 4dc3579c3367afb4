package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// proc is a walcount process started by a test, with what it printed.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer
	done           chan struct{}
}

// walcountEnv is the environment of a walcount process: the test's own
// (TestMain cleared walcount's variables from it) and then env.
func walcountEnv(env ...string) []string {
	return append(os.Environ(), env...)
}

// startWalcount starts the real binary with env added to the environment;
// the process is killed at the end of the test if it is still running.
func startWalcount(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(walcountBinary(t), args...), done: make(chan struct{})}
	p.cmd.Env = walcountEnv(env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit by itself and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("walcount %s did not exit within 2 minutes\nstdout:\n%s\nstderr:\n%s",
			strings.Join(p.cmd.Args[1:], " "), p.stdout.String(), p.stderr.String())
	}
	code := p.cmd.ProcessState.ExitCode()
	p.t.Logf("walcount %s → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(p.cmd.Args[1:], " "), code, p.stdout.String(), p.stderr.String())
	return code
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop() int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.wait()
}

// walcount runs the real binary to its end and returns its exit code,
// stdout and stderr.
func walcount(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	p := startWalcount(t, env, args...)
	code := p.wait()
	return code, p.stdout.String(), p.stderr.String()
}

// unusedAddr returns a loopback address with a port that was free a moment
// ago.
func unusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitStreaming waits until the daemon at addr says it streams.
func waitStreaming(t *testing.T, p *proc, addr string) {
	t.Helper()
	poll(t, "the daemon at "+addr+" to stream", func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("walcount run exited before it streamed:\n%s", p.stderr.String())
		default:
		}
		raw, err := fetchDaemonStatus(context.Background(), addr)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(raw), `"streaming": true`), string(raw)
	})
}
