package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/redisconn"
)

// soakColumns are the CSV's columns. A value that could not be read (a
// server restarting) is empty.
var soakColumns = []string{
	"t_s", "fault", "wc_pid", "wc_rss_bytes", "wc_fds", "wc_goroutines", "wc_heap_inuse_bytes",
	"checkpoint_age_s", "buffer_keys", "pg_backends", "pg_walsenders", "pg_db_bytes",
	"redis_clients", "redis_used_memory_bytes", "redis_keys", "slot_retained_wal_bytes",
	"rows_via", "rows_carried", "rows_parked", "rows_dirty", "rows_runs", "rows_messages",
	"likes", "ops", "op_errors",
}

// sampler writes a CSV row every sampleEvery until ctx ends.
func (k *soak) sampler(ctx context.Context) {
	ropt, err := redisconn.Parse(k.c.redis.URL(), redisconn.TLSOptions{})
	if err != nil {
		k.b.logf("soak sampler: %v", err)
		return
	}
	rdb := redisconn.New(ropt, nil)
	defer rdb.Close()
	t := time.NewTicker(k.s.sampleEvery)
	defer t.Stop()
	for {
		k.sample(ctx, rdb)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (k *soak) sample(ctx context.Context, rdb redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v := map[string]string{
		"t_s":   strconv.FormatFloat(time.Since(k.started).Seconds(), 'f', 1, 64),
		"fault": k.fault.Load().(string),
		"ops":   strconv.FormatInt(k.ops.Load(), 10),
	}
	v["op_errors"] = strconv.FormatInt(k.opErrs.Load(), 10)
	num := func(name string, x int64) { v[name] = strconv.FormatInt(x, 10) }
	if wc := k.walcount(); wc != nil && wc.alive() == nil {
		pid := wc.cmd.Process.Pid
		num("wc_pid", int64(pid))
		if rss, err := procRSS(pid); err == nil {
			num("wc_rss_bytes", rss)
		}
		if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
			num("wc_fds", int64(len(fds)))
		}
		if fams, err := wc.scrape(ctx); err == nil {
			num("wc_goroutines", int64(metricValue(fams, "go_goroutines")))
			num("wc_heap_inuse_bytes", int64(metricValue(fams, "go_memstats_heap_inuse_bytes")))
			v["checkpoint_age_s"] = strconv.FormatFloat(metricValue(fams, "walcount_checkpoint_age_seconds"), 'f', 2, 64)
			num("buffer_keys", int64(metricValue(fams, "walcount_buffer_keys")))
		}
	}
	var backends, senders, dbBytes, retained int64
	if err := k.c.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
  (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'),
  pg_database_size(current_database()),
  coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1), 0)`,
		config.DefaultSlot).Scan(&backends, &senders, &dbBytes, &retained); err == nil {
		num("pg_backends", backends)
		num("pg_walsenders", senders)
		num("pg_db_bytes", dbBytes)
		num("slot_retained_wal_bytes", retained)
	}
	if rows, err := k.stateRows(ctx); err == nil {
		for name, n := range rows {
			num("rows_"+name, n)
		}
	}
	var likes int64
	if err := k.c.db.QueryRow(ctx, `SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'likes'::regclass`).Scan(&likes); err == nil {
		num("likes", likes)
	}
	if info, err := rdb.Info(ctx, "clients", "memory").Result(); err == nil {
		if s := infoField(info, "connected_clients"); s != "" {
			v["redis_clients"] = s
		}
		if s := infoField(info, "used_memory"); s != "" {
			v["redis_used_memory_bytes"] = s
		}
	}
	if n, err := rdb.DBSize(ctx).Result(); err == nil {
		num("redis_keys", n)
	}
	row := make([]string, len(soakColumns))
	for i, c := range soakColumns {
		row[i] = v[c]
	}
	k.csvMu.Lock()
	defer k.csvMu.Unlock()
	w := csv.NewWriter(k.csv)
	_ = w.Write(row)
	w.Flush()
}

// infoField returns a field of Redis INFO's text.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return rest
		}
	}
	return ""
}

// procRSS reads VmRSS of a process.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// seriesStats is one CSV column over the run.
type seriesStats struct {
	name                  string
	n                     int
	first, last, min, max float64
	slopePerHour          float64 // least squares, after the warm-up
	warmN                 int
}

// soakSeries reads a soak CSV (also one still being written) and returns
// each numeric column's figures; the slope leaves out the first tenth of
// the run (the tables and caches warming up).
func soakSeries(path string) ([]seriesStats, float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil && len(recs) == 0 {
		return nil, 0, err
	}
	if len(recs) < 2 {
		return nil, 0, fmt.Errorf("%s: no samples", path)
	}
	head := recs[0]
	recs = recs[1:]
	if last := recs[len(recs)-1]; len(last) != len(head) { // a row cut mid-write
		recs = recs[:len(recs)-1]
	}
	var span float64
	ts := make([]float64, len(recs))
	for i, rec := range recs {
		ts[i], _ = strconv.ParseFloat(rec[0], 64)
		span = ts[i]
	}
	var out []seriesStats
	for col, name := range head {
		if name == "t_s" || name == "fault" || name == "wc_pid" {
			continue
		}
		s := seriesStats{name: name, min: math.Inf(1), max: math.Inf(-1)}
		var sx, sy, sxx, sxy float64
		for i, rec := range recs {
			if col >= len(rec) || rec[col] == "" {
				continue
			}
			y, err := strconv.ParseFloat(rec[col], 64)
			if err != nil {
				continue
			}
			if s.n == 0 {
				s.first = y
			}
			s.n++
			s.last = y
			s.min = math.Min(s.min, y)
			s.max = math.Max(s.max, y)
			if ts[i] < span/10 {
				continue
			}
			x := ts[i] / 3600
			s.warmN++
			sx += x
			sy += y
			sxx += x * x
			sxy += x * y
		}
		if d := float64(s.warmN)*sxx - sx*sx; s.warmN >= 3 && d != 0 {
			s.slopePerHour = (float64(s.warmN)*sxy - sx*sy) / d
		}
		out = append(out, s)
	}
	return out, span, nil
}

// soakSummary is the Markdown report of a run: the resources' figures and
// slopes, the quiet points and the faults.
func soakSummary(csvPath string, quiet []quietPoint, notes []string, s soakSettings, took time.Duration, ops, opErrs int64) (string, error) {
	series, span, err := soakSeries(csvPath)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## The soak\n\n%s of churn (%d statements, %d failed: the servers' restarts) with a fault every %s in rotation (%s), %d clients, bulk inserts of %d rows, row locks held %s; samples every %s in `%s` (%.0f s of samples).\n\n",
		took.Round(time.Second), ops, opErrs, s.faultEvery, strings.Join(s.faults, ", "), s.clients, s.bulk, s.lockHold, s.sampleEvery, csvPath, span)
	b.WriteString(seriesTable(series))
	b.WriteString("\n| at | after | settled in | every counter exact | note |\n|---:|---|---:|---|---|\n")
	for _, q := range quiet {
		exact := "yes"
		if !q.exact() {
			exact = fmt.Sprintf("**no** %v", q.off)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", q.at.Round(time.Second), q.after, q.settled.Round(100*time.Millisecond), exact, q.note)
	}
	if len(notes) > 0 {
		b.WriteString("\nFaults:\n\n")
		for _, n := range notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String(), nil
}

func seriesTable(series []seriesStats) string {
	var b strings.Builder
	b.WriteString("| series | samples | first | last | min | max | slope per hour (after the first tenth) |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range series {
		if s.n == 0 {
			fmt.Fprintf(&b, "| %s | 0 | | | | | |\n", s.name)
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", s.name, s.n, human(s.first), human(s.last), human(s.min), human(s.max), human(s.slopePerHour))
	}
	return b.String()
}

// human prints a figure with a unit prefix when it is large.
func human(x float64) string {
	a := math.Abs(x)
	switch {
	case a >= 1e9:
		return strconv.FormatFloat(x/1e9, 'f', 2, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(x/1e6, 'f', 2, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(x/1e3, 'f', 1, 64) + "k"
	case a == math.Trunc(a):
		return strconv.FormatFloat(x, 'f', 0, 64)
	default:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
}

// runSoakCommand runs the soak (-soak), or summarizes the CSV of one
// (-soak-summary), which may still be running.
func runSoakCommand(ctx context.Context, b *bench, summarize string) int {
	if summarize != "" {
		series, span, err := soakSeries(summarize)
		if err != nil {
			return fail(err)
		}
		fmt.Printf("%s: %.0f s of samples\n\n%s", summarize, span, seriesTable(series))
		return 0
	}
	if err := runSoak(ctx, b, b.soak); err != nil {
		return fail(err)
	}
	return 0
}
