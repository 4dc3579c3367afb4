package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// scrape returns the value of each unlabelled sample of the daemon's
// /metrics at addr, by metric name; nil when it does not answer.
func scrape(addr string) map[string]float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	samples := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			samples[name] = v
		}
	}
	return samples
}

// waitSlotMetrics waits until the walcount at addr exports a reading of
// the slot: the retained WAL and the lag above zero (likes were written
// after setup) and walcount_slot_active as wantActive.
func waitSlotMetrics(t *testing.T, p *proc, addr string, wantActive float64) map[string]float64 {
	t.Helper()
	var m map[string]float64
	poll(t, "the walcount at "+addr+" to export the slot's readings", func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("walcount exited:\n%s", p.stderr.String())
		default:
		}
		m = scrape(addr)
		active, seen := m["walcount_slot_active"]
		return m["walcount_slot_retained_wal_bytes"] > 0 && m["walcount_slot_lag_bytes"] > 0 && seen && active == wantActive,
			fmt.Sprintf("retained %v, lag %v, active %v (exported %v)", m["walcount_slot_retained_wal_bytes"], m["walcount_slot_lag_bytes"], active, seen)
	})
	return m
}

// TestSlotWatchedWhileRedisIsDown starts walcount run while Redis is down,
// as after a Redis outage: run waits in its preflight checks for Redis,
// the slot keeps WAL meanwhile, and that is exactly when its readings must
// be exported (they came only from a streaming daemon before). walcount
// status, with Redis still down and the daemon running, shows the daemon's
// view and suggests no teardown: the slot is inactive because walcount
// waits for Redis, not because walcount is gone.
func TestSlotWatchedWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	c := newSharedCluster(t, testenv.Postgres(t), testenv.Redis(t))
	if err := c.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.connect(t).Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 500) g`); err != nil {
		t.Fatal(err)
	}
	addr := unusedAddr(t)
	p := startWalcount(t, nil, c.cmd("run", "--http-addr", addr, "--flush-interval", "100ms")...)
	waitSlotMetrics(t, p, addr, 0)
	poll(t, "the daemon to report its failed start", func() (bool, string) {
		raw, err := fetchDaemonStatus(ctx, addr)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(raw), `"last_error"`), string(raw)
	})

	began := time.Now()
	if _, err := fetchDaemonStatus(ctx, addr); err != nil {
		t.Errorf("the daemon's /status with Redis down: %v", err)
	}
	t.Logf("the daemon's /status took %s with Redis down", time.Since(began).Round(time.Millisecond))
	code, stdout, _ := walcount(t, nil, c.cmd("status", "--http-addr", addr)...)
	if code != exitFailure {
		t.Errorf("status with Redis down: exit %d, want %d (it warns)", code, exitFailure)
	}
	for _, want := range []string{"redis does not answer", "although the walcount at " + addr + " runs: it does not stream (", "NOT streaming"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("status does not say %q:\n%s", want, stdout)
		}
	}
	for _, bad := range []string{"teardown", "no walcount is streaming"} {
		if strings.Contains(stdout, bad) {
			t.Errorf("status says %q while walcount runs and waits for Redis:\n%s", bad, stdout)
		}
	}
	// Without asking the daemon (it may listen elsewhere), status still
	// sees walcount's sessions on the database and does not call walcount
	// gone.
	_, stdout, _ = walcount(t, nil, c.cmd("status", "--http-addr", "")...)
	if !strings.Contains(stdout, "walcount sessions are connected to the database") || strings.Contains(stdout, "teardown") {
		t.Errorf("status without the daemon's address, while walcount runs:\n%s", stdout)
	}
	if code := p.stop(); code != exitOK {
		t.Errorf("walcount run exited %d after SIGTERM, want 0", code)
	}
}

// TestStandbyExportsSlotReadings runs two walcounts on one slot, as an HA
// pair does: the standby, waiting for the slot the active one holds,
// exports the slot's readings too, so that the slot stays watched through
// the active daemon's crash.
func TestStandbyExportsSlotReadings(t *testing.T) {
	t.Parallel()
	c := newSharedCluster(t, testenv.Postgres(t), testenv.Redis(t))
	active, standby := unusedAddr(t), unusedAddr(t)
	a := startWalcount(t, nil, c.cmd("run", "--http-addr", active, "--flush-interval", "100ms")...)
	waitStreaming(t, a, active)
	// The active daemon acks what it applied; the likes written from now
	// on until the standby's reading keep the lag above zero only while
	// they are unflushed, so the standby is checked on the retained WAL
	// and on the slot being active, which hold whatever the active daemon
	// flushed.
	b := startWalcount(t, nil, c.cmd("run", "--http-addr", standby, "--flush-interval", "100ms")...)
	poll(t, "the standby to export the slot's readings", func() (bool, string) {
		select {
		case <-b.done:
			t.Fatalf("the standby exited:\n%s", b.stderr.String())
		default:
		}
		m := scrape(standby)
		return m["walcount_waiting_for_slot"] == 1 && m["walcount_slot_active"] == 1 && m["walcount_slot_retained_wal_bytes"] > 0,
			fmt.Sprintf("waiting_for_slot %v, slot_active %v, retained %v", m["walcount_waiting_for_slot"], m["walcount_slot_active"], m["walcount_slot_retained_wal_bytes"])
	})
	b.stop()
	a.stop()
}
