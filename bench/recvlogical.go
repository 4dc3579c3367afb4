package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/testkit/servers"
)

// recvlogicalProc is PostgreSQL's own logical replication client,
// pg_recvlogical, reading walcount's slot and publication and writing
// what it receives to /dev/null. It is the write path's reference reader
// (configuration e): what any pgoutput consumer costs the database,
// before the consumer does anything with the changes.
type recvlogicalProc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// startRecvlogical starts pg_recvlogical on the cluster's slot.
func startRecvlogical(dir string, c *cluster) (*recvlogicalProc, error) {
	binDir, err := servers.FindPostgresBin()
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(binDir, "pg_recvlogical")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("pg_recvlogical, PostgreSQL's logical replication client, is not next to the server binaries: %w", err)
	}
	p := &recvlogicalProc{
		logPath: filepath.Join(dir, fmt.Sprintf("recvlogical-%d.log", time.Now().UnixNano())),
		done:    make(chan struct{}),
	}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	p.cmd = exec.Command(bin, "--dbname", c.url, "--slot", config.DefaultSlot, "--start",
		"--option", "proto_version=1", "--option", "publication_names="+config.DefaultPublication,
		"--no-loop", "--file", os.DevNull)
	p.cmd.Stdout = logFile
	p.cmd.Stderr = logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitStreaming waits until the slot has a walsender.
func (p *recvlogicalProc) waitStreaming(ctx context.Context, c *cluster) error {
	for {
		var active bool
		err := c.db.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, config.DefaultSlot).Scan(&active)
		if err == nil && active {
			return nil
		}
		if err := p.alive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for pg_recvlogical to stream: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *recvlogicalProc) alive() error {
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.logPath)
		return fmt.Errorf("pg_recvlogical exited: %v: %s", p.err, strings.TrimSpace(string(b)))
	default:
		return nil
	}
}

func (p *recvlogicalProc) usage() (usage, error) { return procUsage(p.cmd.Process.Pid) }

// stop ends pg_recvlogical (SIGINT is its way to stop) and waits.
func (p *recvlogicalProc) stop() error {
	if err := p.alive(); err != nil {
		return err
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("pg_recvlogical did not stop within 30s")
	}
}

// sentPast waits until the slot's walsender has sent everything up to the
// WAL flushed now: the reader has no backlog.
func (c *cluster) sentPast(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var end string
	if err := c.db.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&end); err != nil {
		return err
	}
	for {
		var done bool
		err := c.db.QueryRow(ctx, `SELECT coalesce(bool_and(r.sent_lsn >= $1::pg_lsn), false)
FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $2`, end, config.DefaultSlot).Scan(&done)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the walsender to send past %s: %w", end, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
