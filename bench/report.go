package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/walcount/walcount/app/config"
)

// results is everything one run measured; sections that did not run are
// nil.
type results struct {
	started time.Time
	elapsed time.Duration
	quick   bool
	// only names the sections of a run of some sections, joined by '+';
	// empty when every section ran.
	only    string
	machine machine
	write   *writeResults
	drain   []drainResult
	fresh   []freshResult
	// reconcile is section 7; reconcileErr says why it failed.
	reconcile    *reconcileResult
	reconcileErr error
	// standby is section 9, as markdown ("" when it did not run).
	standby string
	// multi is section 12, as markdown ("" when it did not run).
	multi string
	// reads is section 13, as markdown ("" when it did not run).
	reads string
	// storm is section 14, as markdown ("" when it did not run).
	storm string
	// app is section 8, without walcount and with it.
	app []appSideResult
	// big is section 11.
	big []bigResult
	// busy describes the load average and CPU steal during the run.
	busy string
	rev  string // the walcount revision measured
}

func (r *results) mode() string {
	if r.quick {
		return "quick run"
	}
	return "full run"
}

// latestName is the base name of the files a run overwrites: a quick run
// and a run of some sections (-only) keep their own, so they never replace
// the full run's figures.
func (r *results) latestName() string {
	return "latest" + r.suffix()
}

// suffix is what a quick run and a run of some sections add to the names
// of their files: -quick, -<sections>.
func (r *results) suffix() string {
	s := ""
	if r.only != "" {
		s += "-" + r.only
	}
	if r.quick {
		s += "-quick"
	}
	return s
}

// save stores the table as <date>.md and latest.md, and the chart as
// latest.svg (with -quick in the names for a quick run).
func (r *results) save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	md := r.markdown()
	dated := r.started.Format("2006-01-02") + r.suffix()
	files := map[string]string{dated + ".md": md, r.latestName() + ".md": md}
	if r.write != nil {
		files[r.latestName()+".svg"] = r.svg()
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var configHeads = map[string]string{
	"a": "(a) insert only, no slot",
	"b": "(b) insert + walcount",
	"c": "(c) counter_cache",
	"d": "(d) AFTER INSERT trigger",
	"e": "(e) insert + pg_recvlogical",
}

func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# walcount benchmark, %s (%s, %s)\n\n", r.started.Format("2006-01-02"), r.mode(), r.elapsed.Round(time.Second))
	if r.rev != "" {
		fmt.Fprintf(&b, "walcount %s. ", r.rev)
	}
	fmt.Fprintf(&b, "Machine: %s.\n\n", r.machine.summary())
	if r.busy != "" {
		fmt.Fprintf(&b, "Other load on the machine: %s. Figures are disturbed when the load average exceeds the CPU count.\n\n", r.busy)
	}
	fmt.Fprintf(&b, "Every configuration on a fresh cluster: fsync on, `synchronous_commit=on`, `wal_level=logical`. "+
		"walcount runs as its own process (`walcount run`) with every default (flush interval %s). "+
		"Method: [docs/benchmarks.md](../../docs/benchmarks.md).\n\n", config.DefaultFlushInterval)
	if r.write != nil {
		r.writeSection(&b)
	}
	if r.drain != nil {
		r.drainSection(&b)
	}
	if len(r.fresh) > 0 {
		r.freshSection(&b)
	}
	r.amplificationSection(&b)
	r.costSection(&b)
	r.readerSection(&b)
	if r.reconcile != nil {
		r.reconcileSection(&b)
	}
	if len(r.app) > 0 {
		r.appSection(&b)
	}
	b.WriteString(r.standby)
	if len(r.big) > 0 {
		r.bigSection(&b)
	}
	b.WriteString(r.multi)
	b.WriteString(r.reads)
	b.WriteString(r.storm)
	r.targetsSection(&b)
	return b.String()
}

func (r *results) writeSection(b *strings.Builder) {
	w := r.write
	fmt.Fprintf(b, "## 1. App write path\n\n")
	fmt.Fprintf(b, "Likes per second (ratio to (a)); each client on its own connection, one like per transaction, closed loop. "+
		"(e) keeps no count: PostgreSQL's own client, pg_recvlogical, reads the same slot and publication and writes to /dev/null, "+
		"which is what any pgoutput reader costs the database.\n\n")
	heads, keys, aligns := "", "", ""
	for _, cfg := range appConfigs {
		heads += " " + configHeads[cfg.key] + " |"
		keys += " (" + cfg.key + ") |"
		aligns += "--:|"
	}
	fmt.Fprintf(b, "| workload | clients |%s\n|---|--:|%s\n", heads, aligns)
	for _, wl := range workloads {
		for _, n := range clientCountsOf(w) {
			base, _ := w.cell("a", wl.name, n)
			fmt.Fprintf(b, "| %s | %d |", wl.name, n)
			for _, cfg := range appConfigs {
				c, ok := w.cell(cfg.key, wl.name, n)
				switch {
				case !ok:
					b.WriteString(" – |")
				case cfg.key == "a":
					fmt.Fprintf(b, " %s |", thousands(c.res.tps()))
				default:
					fmt.Fprintf(b, " %s (%s) |", thousands(c.res.tps()), ratio(c.res.tps(), base.res.tps()))
				}
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(b, "\nLatency of one like, p50 / p99 in ms:\n\n")
	fmt.Fprintf(b, "| workload | clients |%s\n|---|--:|%s\n", keys, aligns)
	for _, wl := range workloads {
		for _, n := range clientCountsOf(w) {
			fmt.Fprintf(b, "| %s | %d |", wl.name, n)
			for _, cfg := range appConfigs {
				if c, ok := w.cell(cfg.key, wl.name, n); ok {
					fmt.Fprintf(b, " %.2f / %.2f |", ms(c.res.quantile(0.5)), ms(c.res.quantile(0.99)))
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
	}
	var exact []string
	for _, t := range w.totals {
		if t.exact {
			exact = append(exact, fmt.Sprintf("(%s) %s", t.config, t.workload))
		}
	}
	if len(exact) > 0 {
		fmt.Fprintf(b, "\nEvery post's likes_count equalled COUNT(*) at the end of: %s.\n", strings.Join(exact, ", "))
	}
	b.WriteString("\n")
}

func clientCountsOf(w *writeResults) []int {
	var out []int
	for _, c := range w.cells {
		found := false
		for _, n := range out {
			found = found || n == c.clients
		}
		if !found {
			out = append(out, c.clients)
		}
	}
	return out
}

func (r *results) drainSection(b *strings.Builder) {
	fmt.Fprintf(b, "## 2. Drain\n\n")
	fmt.Fprintf(b, "A backlog built while walcount is stopped, then read from the start. The bare reader decodes every message with pglogrepl and throws it away, "+
		"over a second slot on the same server; walcount's time runs from its process start until W (the checkpoint) passes the backlog's end.\n\n")
	fmt.Fprintf(b, "| backlog | likes | WAL | bare pglogrepl reader | walcount: stream at end | walcount: W past end | walcount / bare | Redis script calls |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, d := range r.drain {
		fmt.Fprintf(b, "| %s | %s | %.0f MiB | %.2f s (%s likes/s) | %.2f s | %.2f s (%s likes/s) | %s | %s (%s txns each) |\n",
			d.shape.name, thousands(float64(d.likes)), float64(d.walBytes)/(1<<20),
			d.bare.elapsed.Seconds(), thousands(d.bareRate()), d.received.Seconds(),
			d.done.Seconds(), thousands(d.rate()), ratio(d.rate(), d.bareRate()),
			thousands(float64(d.scripts)), perCall(d.txns, d.scripts))
	}
	fmt.Fprintf(b, "\nWhere the time goes: CPU time of the walsender (PostgreSQL decoding and sending) and of walcount during each drain, as a share of the drain's duration.\n\n")
	fmt.Fprintf(b, "| backlog | walsender for the bare reader | walsender for walcount | walcount process |\n|---|--:|--:|--:|\n")
	for _, d := range r.drain {
		fmt.Fprintf(b, "| %s | %.1f s (%s) | %.1f s (%s) | %s |\n", d.shape.name,
			d.bare.sender.Seconds(), share(d.bare.sender, d.bare.elapsed),
			d.sender.Seconds(), share(d.sender, d.done), cpuShare(d.cost.cpu, d.done))
	}
	b.WriteString("\n")
}

func share(cpu, wall time.Duration) string {
	if wall <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*cpu.Seconds()/wall.Seconds())
}

func cpuShare(cpu, wall time.Duration) string {
	if cpu <= 0 {
		return "– (in-process)"
	}
	return fmt.Sprintf("%.1f s (%s)", cpu.Seconds(), share(cpu, wall))
}

func (r *results) freshSection(b *strings.Builder) {
	limit := config.DefaultFlushInterval + 250*time.Millisecond
	fmt.Fprintf(b, "## 3. Freshness\n\n")
	fmt.Fprintf(b, "Likes at a fixed rate (Zipf over 10k posts, %d paced clients) with walcount running: half of walcount's drain rate for single-row transactions, and a moderate rate. "+
		"`walcount_apply_lag_seconds` is interpolated inside its buckets; the probe likes post 0 every %s and times commit → likes_count visible.\n\n",
		freshClients, probeInterval)
	fmt.Fprintf(b, "| rate: target / achieved | apply lag p50 | apply lag p99 (bucket) | probe p50 | probe p99 | probe max | p99 ≤ flush interval + 250 ms |\n|--:|--:|--:|--:|--:|--:|:-:|\n")
	for _, f := range r.fresh {
		p99 := f.probe(0.99)
		verdict := "yes"
		if p99 > limit {
			verdict = "no"
		}
		fmt.Fprintf(b, "| %s / %s likes/s | %s | %s (≤ %gs) | %s | %s | %s | %s (%s) |\n",
			thousands(f.target), thousands(f.achieved), seconds(f.lagP50), seconds(f.lagP99), f.lagBucketP99,
			dur(f.probe(0.5)), dur(p99), dur(f.probe(1)), verdict, dur(limit))
	}
	b.WriteString("\n")
}

func (r *results) amplificationSection(b *strings.Builder) {
	if r.write == nil && len(r.fresh) == 0 {
		return
	}
	fmt.Fprintf(b, "## 4. Write amplification\n\n")
	fmt.Fprintf(b, "Rows updated in posts (`pg_stat_user_tables.n_tup_upd`) per 100k likes.\n\n")
	fmt.Fprintf(b, "| run | (b) walcount | (c) counter_cache | (d) trigger |\n|---|--:|--:|--:|\n")
	if r.write != nil {
		for _, wl := range workloads {
			fmt.Fprintf(b, "| app write path, %s |", wl.name)
			for _, k := range []string{"b", "c", "d"} {
				if t, ok := r.write.total(k, wl.name); ok && t.likes > 0 {
					fmt.Fprintf(b, " %s |", thousands(per100k(t.updates, t.likes)))
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
	}
	for _, f := range r.fresh {
		if f.total > 0 {
			fmt.Fprintf(b, "| fixed rate %s likes/s, Zipf over 10k posts | %s | – | – |\n", thousands(f.achieved), thousands(per100k(f.updates, f.total)))
		}
	}
	b.WriteString("\n")
	for _, f := range r.fresh {
		if f.flushes > 0 {
			fmt.Fprintf(b, "At %s likes/s walcount committed %s flushes that wrote %s non-zero deltas (`walcount_deltas_flushed_total`), "+
				"and PostgreSQL counted %s row updates on posts (%s per flush): one per touched post per flush.\n\n",
				thousands(f.achieved), thousands(f.flushes), thousands(f.deltas), thousands(float64(f.updates)), thousands(float64(f.updates)/f.flushes))
		}
	}
}

func perCall(txns, calls int64) string {
	if calls == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", float64(txns)/float64(calls))
}

func per100k(updates, likes int64) float64 { return float64(updates) / float64(likes) * 1e5 }

func (r *results) costSection(b *strings.Builder) {
	type row struct {
		name  string
		likes int64
		u     usage
	}
	var rows []row
	for _, d := range r.drain {
		if d.cost.cpu > 0 || d.cost.peakRSS > 0 {
			rows = append(rows, row{"drain, " + d.shape.name, d.likes, d.cost})
		}
	}
	if r.write != nil {
		for _, t := range r.write.totals {
			if t.config == "b" && t.likes > 0 {
				rows = append(rows, row{"app write path (b), " + t.workload + ", all steps", t.likes, t.cost})
			}
		}
	}
	for _, f := range r.fresh {
		if f.likes > 0 {
			rows = append(rows, row{fmt.Sprintf("fixed rate %s likes/s (measurement window)", thousands(f.achieved)), f.likes, usage{cpu: f.cpu, peakRSS: f.peakRSS}})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "## 5. Daemon cost\n\n")
	fmt.Fprintf(b, "CPU time (user + system) of the `walcount run` process from /proc/<pid>/stat, peak RSS from VmHWM.\n\n")
	fmt.Fprintf(b, "| run | likes | CPU | CPU per 1M likes | peak RSS |\n|---|--:|--:|--:|--:|\n")
	for _, x := range rows {
		fmt.Fprintf(b, "| %s | %s | %.2f s | %.2f s | %.0f MiB |\n", x.name, thousands(float64(x.likes)), x.u.cpu.Seconds(),
			x.u.cpu.Seconds()/float64(x.likes)*1e6, float64(x.u.peakRSS)/(1<<20))
	}
	b.WriteString("\n")
}

// readerSection compares what the slot's reader costs during the write
// path, walcount (b) against pg_recvlogical (e): the walsender's CPU
// (decoding and sending, inside PostgreSQL) and the reader's own.
func (r *results) readerSection(b *strings.Builder) {
	if r.write == nil {
		return
	}
	var rows []string
	for _, wl := range workloads {
		for _, k := range []string{"b", "e"} {
			t, ok := r.write.total(k, wl.name)
			if !ok || t.likes == 0 {
				continue
			}
			per := func(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()/float64(t.likes)*1e6) }
			redis := "–"
			if k == "b" {
				redis = per(t.redis)
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s |", wl.name, configHeads[k], thousands(float64(t.likes)), per(t.sender), per(t.cost.cpu), redis))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "## 6. What reading the slot costs\n\n")
	fmt.Fprintf(b, "CPU seconds per 1M likes over all of section 1's steps (the readers idle while other configurations run): "+
		"the walsender that decodes and sends the WAL, inside PostgreSQL, the process that reads it, and for walcount its Redis.\n\n")
	fmt.Fprintf(b, "| workload | reader | likes | walsender CPU per 1M likes | reader CPU per 1M likes | Redis CPU per 1M likes |\n|---|---|--:|--:|--:|--:|\n%s\n\n", strings.Join(rows, "\n"))
}

func (r *results) targetsSection(b *strings.Builder) {
	var lines []string
	if r.write != nil {
		a, okA := r.write.cell("a", workloads[0].name, 32)
		bb, okB := r.write.cell("b", workloads[0].name, 32)
		if okA && okB {
			q := bb.res.tps() / a.res.tps()
			lines = append(lines, fmt.Sprintf("- (b) ≥ 0.9 × (a) on the hot post at 32 clients: %s (%.2f×)", yesNo(q >= 0.9), q))
			if e, ok := r.write.cell("e", workloads[0].name, 32); ok {
				lines = append(lines, fmt.Sprintf("  - for reference, (e) pg_recvlogical on the same slot: %.2f× (a)", e.res.tps()/a.res.tps()))
			}
		}
	}
	for _, d := range r.drain {
		if d.shape.rowsPer == 1000 {
			q := d.rate() / d.bareRate()
			lines = append(lines, fmt.Sprintf("- drain ≥ 0.8 × the bare reader, 1000-row transactions: %s (%.2f×)", yesNo(q >= 0.8), q))
		}
	}
	for _, f := range r.fresh {
		limit := config.DefaultFlushInterval + 250*time.Millisecond
		lines = append(lines, fmt.Sprintf("- freshness p99 ≤ flush interval + 250 ms (%s) at %s likes/s: %s (probe p99 %s; histogram p99 %s)",
			dur(limit), thousands(f.achieved), yesNo(f.probe(0.99) <= limit), dur(f.probe(0.99)), seconds(f.lagP99)))
	}
	if x := r.reconcile; x != nil && x.pass.elapsed > 0 && x.truth > 0 {
		q := x.pass.elapsed.Seconds() / x.truth.Seconds()
		lines = append(lines, fmt.Sprintf("- full reconciliation pass ≤ 3 × one truth computation: %s (%.2f×: %s against %s)", yesNo(q <= 3), q, dur(x.pass.elapsed), dur(x.truth)))
		lines = append(lines, fmt.Sprintf("- the pass found exactly the injected drift: %s (%d injected, %d found, %d corrected)",
			yesNo(x.pass.drifted == x.injected && x.pass.corrected == x.injected), x.injected, x.pass.drifted, x.pass.corrected))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "## Targets\n\n%s\n", strings.Join(lines, "\n")+"\n")
}

func yesNo(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// thousands formats a rounded number with thousands separators.
func thousands(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func ratio(x, base float64) string {
	if base <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x/base)
}

func seconds(s float64) string {
	if math.IsNaN(s) {
		return "–"
	}
	return dur(time.Duration(s * float64(time.Second)))
}

func dur(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
