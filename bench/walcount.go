package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/walcount/walcount/internal/httpapi"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// Linux fixes it at 100 for user space whatever the kernel's HZ.
const clockTicks = 100

// walcountProc is `walcount run` as a child process, so that its CPU time
// and peak RSS are its own (read from /proc) and its start is a real start.
type walcountProc struct {
	cmd     *exec.Cmd
	addr    string // HTTP address of /metrics
	logPath string
	started time.Time
	done    chan struct{}
	err     error
}

// startReady starts walcount as startWalcount does and waits, a minute
// at most, until it serves its metrics; a walcount that does not is
// stopped.
func startReady(ctx context.Context, b *bench, c *cluster, extra ...string) (*walcountProc, error) {
	wc, err := startWalcount(b.bin, b.tmp, c, extra...)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := wc.waitMetrics(sctx); err != nil {
		_ = wc.stop()
		return nil, err
	}
	return wc, nil
}

// startWalcount runs `bin run` against the cluster with every default but
// the HTTP address, logging to a file in dir.
func startWalcount(bin, dir string, c *cluster, extra ...string) (*walcountProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	w := &walcountProc{
		addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		logPath: filepath.Join(dir, fmt.Sprintf("walcount-%d.log", time.Now().UnixNano())),
		done:    make(chan struct{}),
	}
	logFile, err := os.Create(w.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	args := append([]string{"run",
		"--database-url", c.url,
		"--redis-url", c.redis.URL(),
		"--http-addr", w.addr,
		"--log-level", "warn",
	}, extra...)
	w.cmd = exec.Command(bin, args...)
	w.cmd.Stdout = logFile
	w.cmd.Stderr = logFile
	w.cmd.Env = append(os.Environ(), "WALCOUNT_CONFIG=")
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	w.started = time.Now()
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	return w, nil
}

// stop sends SIGTERM (a clean shutdown with a final flush) and waits.
func (w *walcountProc) stop() error {
	select {
	case <-w.done:
		return fmt.Errorf("walcount exited early: %v; log:\n%s", w.err, w.logTail())
	default:
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
		return nil
	case <-time.After(60 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
		return errors.New("walcount did not stop within 60s")
	}
}

// alive returns an error when the process has exited.
func (w *walcountProc) alive() error {
	select {
	case <-w.done:
		return fmt.Errorf("walcount exited: %v; log:\n%s", w.err, w.logTail())
	default:
		return nil
	}
}

func (w *walcountProc) logTail() string {
	b, _ := os.ReadFile(w.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// usage is a process's CPU time and peak resident set size.
type usage struct {
	cpu     time.Duration // user + system
	peakRSS int64         // bytes (VmHWM)
}

// usage reads the process's CPU time and peak RSS.
func (w *walcountProc) usage() (usage, error) { return procUsage(w.cmd.Process.Pid) }

// procUsage reads /proc/<pid>/stat and /proc/<pid>/status.
func procUsage(pid int) (usage, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return usage{}, err
	}
	// The command name (field 2) may hold spaces; fields count from the
	// closing parenthesis. utime and stime are fields 14 and 15.
	s := string(b)
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(rest) < 13 {
		return usage{}, fmt.Errorf("parse /proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(rest[11], 10, 64)
	st, err2 := strconv.ParseInt(rest[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return usage{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	u := usage{cpu: time.Duration(ut+st) * time.Second / clockTicks}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return usage{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return usage{}, fmt.Errorf("parse VmHWM %q: %w", v, err)
			}
			u.peakRSS = kb << 10
		}
	}
	return u, sc.Err()
}

// metricsLimit bounds the /metrics scrape read: far above the daemon's
// whole exposition, which is some tens of kilobytes.
const metricsLimit = 64 << 20

// scrape reads the daemon's /metrics.
func (w *walcountProc) scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	r, err := httpapi.Get(ctx, w.addr, "/metrics", metricsLimit)
	if err != nil {
		return nil, err
	}
	if r.Code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", r.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(r.Body))
}

// waitMetrics waits until /metrics answers (the daemon is up).
func (w *walcountProc) waitMetrics(ctx context.Context) error {
	for {
		if _, err := w.scrape(ctx); err == nil {
			return nil
		}
		if err := w.alive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for walcount /metrics: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// metricValue returns the value of an unlabelled gauge or counter.
func metricValue(fams map[string]*dto.MetricFamily, name string) float64 {
	f := fams[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	m := f.GetMetric()[0]
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// lagBuckets returns the apply-lag histogram's cumulative buckets.
func lagBuckets(fams map[string]*dto.MetricFamily) []bucket {
	f := fams["walcount_apply_lag_seconds"]
	if f == nil || len(f.GetMetric()) == 0 {
		return nil
	}
	return histBuckets(f.GetMetric()[0].GetHistogram())
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// gaugeOf returns an in-process gauge's value.
func gaugeOf(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}
