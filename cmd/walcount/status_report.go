package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/redact"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// statusReport is what walcount status prints; it works whether or not
// the daemon runs.
type statusReport struct {
	Slot            slot.SlotStatus `json:"slot"`
	Checkpoint      string          `json:"checkpoint_lsn,omitempty"`
	CheckpointAt    *time.Time      `json:"checkpoint_updated_at,omitempty"`
	CheckpointAge   *float64        `json:"checkpoint_age_seconds,omitempty"`
	CheckpointError string          `json:"checkpoint_error,omitempty"`
	// Dirty are the counters, or keys, walcount cannot vouch for until a
	// reconciliation repaired them, read from its state schema.
	Dirty []state.Dirty `json:"dirty,omitempty"`
	// Carried is what the flushes carried to the next: keys whose target
	// row the app holds locked, and parked keys (design rule 2).
	Carried         *state.CarriedSummary `json:"carried,omitempty"`
	RedisLSN        string                `json:"redis_lsn,omitempty"`
	BufferKeys      *int64                `json:"buffer_keys,omitempty"`
	FlushInProgress bool                  `json:"flush_in_progress"`
	RedisError      string                `json:"redis_error,omitempty"`
	RedisEviction   string                `json:"redis_eviction,omitempty"`
	Daemon          json.RawMessage       `json:"daemon,omitempty"`
	DaemonError     string                `json:"daemon_error,omitempty"`
	// WalcountSessions counts the other sessions of walcount's role named
	// application_name walcount on the database (pg_stat_activity): a
	// walcount that runs but does not stream still holds its pool's
	// connections, so an inactive slot with sessions is no sign that
	// walcount is gone.
	WalcountSessions *int64   `json:"walcount_sessions,omitempty"`
	Warnings         []string `json:"warnings,omitempty"`
}

// statusRedisTimeout bounds each of status's reads of Redis.
const statusRedisTimeout = 2 * time.Second

func runStatus(ctx context.Context, out io.Writer, cfg config.Config, asJSON bool) error {
	conn, err := connectPG(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var r statusReport
	// The slot lives where replication_url points (a hot standby that
	// decodes, or a pooler's direct connection).
	slotConn := conn
	if cfg.SeparateSlotServer() {
		sc, err := cfg.ConnectSlotSQL(ctx)
		if err != nil {
			return fmt.Errorf("connect to the replication URL %s: %s", redact.URL(cfg.ReplicationURL), redact.URL(err.Error()))
		}
		defer sc.Close(context.Background())
		slotConn = sc
	}
	if r.Slot, err = slot.ReadSlot(ctx, slotConn, cfg.Slot); err != nil {
		return err
	}
	if w, age, err := state.ReadCheckpointAge(ctx, conn, cfg.Slot); err != nil {
		r.CheckpointError = fmt.Sprintf("no checkpoint (%v); run walcount setup", err)
	} else {
		at, sec := time.Now().Add(-age), age.Seconds()
		r.Checkpoint, r.CheckpointAt, r.CheckpointAge = w.String(), &at, &sec
		if r.Dirty, err = state.ListDirty(ctx, conn, cfg.Slot); err != nil {
			return err
		}
		c, err := state.ReadCarriedSummary(ctx, conn, cfg.Slot)
		if err != nil {
			return err
		}
		r.Carried = &c
	}
	if ropt, err := cfg.RedisOptions(); err != nil {
		// A parse error may quote the URL, password included.
		r.RedisError = redact.URL(err.Error())
	} else {
		// A report reads Redis once: no retries with backoff, and
		// go-redis's own lines about failed dials (the report says it)
		// go nowhere instead of to stderr.
		rdb := redisconn.New(ropt.WithTimeout(statusRedisTimeout), zap.NewNop())
		defer rdb.Close()
		buf := buffer.New(rdb, cfg.Slot)
		if meta, err := buf.Meta(ctx); err != nil {
			r.RedisError = redact.URL(err.Error())
		} else {
			if meta.Exists {
				r.RedisLSN = meta.LSN.String()
				r.FlushInProgress = meta.Flushing
				if n, err := buf.Len(ctx); err == nil {
					r.BufferKeys = &n
				}
			}
			if ev, err := buffer.ReadEviction(ctx, rdb); err == nil && ev.Risky() {
				r.RedisEviction = ev.String() + "; fix: " + buffer.EvictionFix
			}
		}
	}
	if cfg.HTTPAddr != "" {
		r.Daemon, err = fetchDaemonStatus(ctx, cfg.HTTPAddr)
		if err != nil {
			r.DaemonError = fmt.Sprintf("no daemon answers at %s (%v); if it listens elsewhere, point at it with --http-addr or WALCOUNT_HTTP_ADDR", cfg.HTTPAddr, err)
		}
	}
	if r.Daemon == nil {
		r.WalcountSessions = countWalcountSessions(ctx, conn, slotConn.PgConn().PID())
	}
	r.Warnings = statusWarnings(r, cfg.HTTPAddr)
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		printStatus(out, cfg, r)
	}
	if len(r.Warnings) > 0 {
		// The report says what is wrong; the status lets a script or a
		// cron job notice without parsing it.
		return exitCodeError{exitFailure}
	}
	return nil
}

// countWalcountSessions counts the sessions of other walcount processes on
// the database (the daemon names its connections application_name
// walcount), leaving out status's own: conn's and the backend slotPID of
// its connection to replication_url; nil when pg_stat_activity cannot be
// read.
func countWalcountSessions(ctx context.Context, conn *pgx.Conn, slotPID uint32) *int64 {
	var n int64
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'walcount' AND pid <> pg_backend_pid() AND pid <> $1
		  AND datname = current_database() AND backend_type = 'client backend'`, int64(slotPID)).Scan(&n)
	if err != nil {
		return nil
	}
	return &n
}

// statusDaemonTimeout bounds status's request to the daemon's /status.
// The daemon bounds each of its reads of a server by 2 s, and reads Redis
// beside PostgreSQL, so it answers within that even while Redis is down:
// which is when its view matters most.
const statusDaemonTimeout = 5 * time.Second

func fetchDaemonStatus(ctx context.Context, addr string) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, statusDaemonTimeout)
	defer cancel()
	r, err := httpapi.Get(ctx, addr, "/status", 1<<20)
	if err != nil {
		return nil, err
	}
	if r.Code != http.StatusOK {
		return nil, fmt.Errorf("status %s", r.Status)
	}
	return json.RawMessage(r.Body), nil
}

// inactiveWarning says why the slot has no reader, from what status could
// see: the daemon's own view when it answers, else whether walcount's
// sessions are on the database. It never suggests dropping the slot: an
// inactive slot is what a walcount waiting for Redis, restarting or
// failing over looks like, and dropping it loses every change not yet
// applied (walcount teardown is for removing walcount, see the docs).
func inactiveWarning(r statusReport, httpAddr string) string {
	held := ""
	if lag := r.Slot.LagBytes; lag > 0 {
		held = fmt.Sprintf("; it holds back %s of WAL that keeps growing while writes continue", humanBytes(lag))
	}
	if r.Daemon != nil {
		var d struct {
			LastError string `json:"last_error"`
		}
		_ = json.Unmarshal(r.Daemon, &d)
		msg := fmt.Sprintf("the slot is INACTIVE although the walcount at %s runs", httpAddr)
		if d.LastError != "" {
			msg += ": it does not stream (" + d.LastError + ")"
		}
		return msg + held + " until it streams again; nothing is lost meanwhile"
	}
	if n := r.WalcountSessions; n != nil && *n > 0 {
		return fmt.Sprintf("the slot is INACTIVE, but %d walcount sessions are connected to the database: a walcount runs and does not stream; its log and its /status say why", *n) + held
	}
	return "the slot is INACTIVE: no walcount is streaming from it or connected to the database" + held + "; start walcount run (walcount status --http-addr asks a daemon that listens elsewhere)"
}

// DeferredWarnAfter is how long a key may be carried (its row locked by
// the app) before walcount status warns about it; the alert
// WalcountFlushKeyDeferred uses the same.
const DeferredWarnAfter = 3 * time.Minute

// statusWarnings says in words what an operator must look at.
func statusWarnings(r statusReport, httpAddr string) []string {
	var w []string
	s := r.Slot
	if err := s.Err(); err != nil {
		w = append(w, err.Error())
		return w
	}
	if !s.Active {
		w = append(w, inactiveWarning(r, httpAddr))
	}
	if s.WALStatus == slot.WALUnreserved {
		past := ""
		if n := s.SafeWALSizeBytes; n != nil && *n < 0 {
			past = fmt.Sprintf(" (it retains %s more than max_slot_wal_keep_size allows)", humanBytes(-*n))
		}
		w = append(w, "wal_status is unreserved: the slot is about to lose WAL it needs"+past+"; catch up now or raise max_slot_wal_keep_size")
	}
	if r.CheckpointError != "" {
		w = append(w, "walcount.checkpoint: "+r.CheckpointError)
	}
	for _, counter := range dirtyCounters(r.Dirty) {
		w = append(w, fmt.Sprintf("counter %s is DIRTY (%s): its counts may be wrong until walcount's reconciliation repairs it, which it runs by itself", counter.name, counter.cause))
	}
	if c := r.Carried; c != nil {
		if c.Oldest != nil && c.OldestAge >= DeferredWarnAfter.Seconds() {
			w = append(w, fmt.Sprintf("counter %s key %s has been carried for %s: a transaction has held its target row locked that long (find it in pg_locks and pg_stat_activity and end it); every other key is applied",
				c.Oldest.Counter, c.Oldest.Key, secondsAgo(c.OldestAge)))
		}
		for _, p := range c.ParkedKeys {
			w = append(w, fmt.Sprintf("counter %s key %s is PARKED: its update fails (%s); walcount keeps its delta, retries it and repairs it by reconciliation once it can be written",
				p.Counter, p.Key, p.Parked))
		}
	}
	if r.RedisError != "" {
		w = append(w, "redis does not answer: "+r.RedisError+"; walcount cannot buffer deltas until it does (check --redis-url / WALCOUNT_REDIS_URL and the server)")
	}
	if r.RedisEviction != "" {
		w = append(w, "redis: "+r.RedisEviction)
	}
	if r.Daemon != nil {
		var d struct {
			Streaming bool     `json:"streaming"`
			Waiting   bool     `json:"waiting_for_slot"`
			Failures  int      `json:"consecutive_failures"`
			LastError string   `json:"last_error"`
			Degraded  []string `json:"degraded"`
		}
		err := json.Unmarshal(r.Daemon, &d)
		for _, name := range d.Degraded {
			w = append(w, fmt.Sprintf("counter %s is DEGRADED: its source's replica identity lacks a column it reads, so deletes and updates cannot be attributed; restore it (walcount check says how) and walcount repairs the counter by itself", name))
		}
		if err == nil && !d.Streaming && !d.Waiting {
			msg := fmt.Sprintf("the daemon is NOT streaming (%d consecutive failures)", d.Failures)
			if d.LastError != "" {
				msg += ": " + d.LastError
			}
			w = append(w, msg)
		}
	}
	return w
}

func printStatus(out io.Writer, cfg config.Config, r statusReport) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	s := r.Slot
	fmt.Fprintf(tw, "slot\t%s\n", cfg.Slot)
	if !s.Exists {
		fmt.Fprintf(tw, "state\tmissing (run walcount setup)\n")
	} else {
		state := "inactive"
		if s.Active {
			state = fmt.Sprintf("active (pid %d)", s.ActivePID)
		}
		fmt.Fprintf(tw, "state\t%s\n", state)
		fmt.Fprintf(tw, "lag\t%s\n", humanBytes(s.LagBytes))
		if s.RestartLSN == 0 {
			// restart_lsn is NULL: the slot keeps no WAL, because it is lost.
			fmt.Fprintf(tw, "retained WAL\tnone (restart_lsn is NULL)\n")
		} else {
			fmt.Fprintf(tw, "retained WAL\t%s\n", humanBytes(s.RetainedWALBytes))
		}
		fmt.Fprintf(tw, "wal_status\t%s\n", walStatusLine(s))
		switch {
		case s.SafeWALSizeBytes != nil && *s.SafeWALSizeBytes < 0:
			fmt.Fprintf(tw, "safe_wal_size\tPAST THE LIMIT by %s: the slot retains more WAL than max_slot_wal_keep_size allows, and the next checkpoint may remove WAL it needs (the slot is then lost)\n", humanBytes(-*s.SafeWALSizeBytes))
		case s.SafeWALSizeBytes != nil:
			fmt.Fprintf(tw, "safe_wal_size\t%s more WAL before the slot is lost\n", humanBytes(*s.SafeWALSizeBytes))
		case s.Invalidated:
			fmt.Fprintf(tw, "safe_wal_size\tnone: the slot is lost\n")
		default:
			fmt.Fprintf(tw, "safe_wal_size\tunlimited (max_slot_wal_keep_size = -1)\n")
		}
		fmt.Fprintf(tw, "confirmed\t%s\n", s.ConfirmedFlushLSN)
	}
	if r.CheckpointError != "" {
		fmt.Fprintf(tw, "checkpoint (W)\t%s\n", r.CheckpointError)
	} else {
		fmt.Fprintf(tw, "checkpoint (W)\t%s, moved %s ago\n", r.Checkpoint, secondsAgo(*r.CheckpointAge))
	}
	switch {
	case r.RedisError != "":
		fmt.Fprintf(tw, "buffer\tredis error: %s\n", r.RedisError)
	case r.BufferKeys == nil:
		fmt.Fprintf(tw, "buffer\tempty (no walcount keys in redis)\n")
	default:
		fl := ""
		if r.FlushInProgress {
			fl = ", flush in progress"
		}
		fmt.Fprintf(tw, "buffer\t%d keys up to %s%s\n", *r.BufferKeys, r.RedisLSN, fl)
	}
	if c := r.Carried; c != nil && c.Oldest != nil {
		fmt.Fprintf(tw, "carried\t%d keys whose row is locked by another transaction; oldest %s key %s (delta %+d) for %s\n",
			c.Deferred, c.Oldest.Counter, c.Oldest.Key, c.Oldest.Delta, secondsAgo(c.OldestAge))
	}
	if c := r.Carried; c != nil {
		for _, p := range c.ParkedKeys {
			fmt.Fprintf(tw, "parked\t%s key %s (delta %+d), since %s ago: %s\n", p.Counter, p.Key, p.Delta, secondsAgo(time.Since(p.Since).Seconds()), p.Parked)
		}
		if n := c.Parked - int64(len(c.ParkedKeys)); n > 0 {
			fmt.Fprintf(tw, "parked\tand %d more keys\n", n)
		}
	}
	for _, c := range dirtyCounters(r.Dirty) {
		fmt.Fprintf(tw, "dirty\t%s: %s, since %s ago\n", c.name, c.what, secondsAgo(time.Since(c.since).Seconds()))
	}
	if r.DaemonError != "" {
		fmt.Fprintf(tw, "daemon\t%s\n", r.DaemonError)
	} else if r.Daemon != nil {
		// The fields of daemon.Status that a person reads first.
		var d struct {
			Streaming    bool     `json:"streaming"`
			Waiting      bool     `json:"waiting_for_slot"`
			Received     string   `json:"received_lsn"`
			Age          *float64 `json:"checkpoint_age_seconds"`
			Failures     int      `json:"consecutive_failures"`
			LastError    string   `json:"last_error"`
			StandbySlots []string `json:"standby_slots"`
			AckHeld      int64    `json:"ack_held_bytes"`
			StandbyWait  *struct {
				Seconds float64 `json:"seconds"`
				Slots   []struct {
					Slot   string `json:"slot"`
					Active bool   `json:"active"`
				} `json:"slots"`
			} `json:"standby_wait"`
			SlotWait *struct {
				Waiting float64 `json:"waiting_seconds"`
				PID     int32   `json:"pid"`
				Age     float64 `json:"xact_age_seconds"`
			} `json:"slot_creation_wait"`
			ApplyLag *struct {
				Pending   float64  `json:"pending_seconds"`
				LastFlush *float64 `json:"last_flush_seconds"`
			} `json:"apply_lag"`
			FreshReads *daemon.FreshReadStatus `json:"fresh_reads"`
			Events     *daemon.EventsStatus    `json:"events"`
		}
		_ = json.Unmarshal(r.Daemon, &d)
		switch {
		case d.Streaming:
			line := "streaming, received up to " + d.Received
			if d.Age != nil {
				line += ", last flush " + secondsAgo(*d.Age) + " ago"
			}
			fmt.Fprintf(tw, "daemon\t%s\n", line)
		case d.Waiting:
			fmt.Fprintf(tw, "daemon\tstandby: another walcount holds the slot\n")
		default:
			fmt.Fprintf(tw, "daemon\tNOT streaming (%d consecutive failures)\n", d.Failures)
		}
		if l := d.ApplyLag; l != nil && d.Streaming {
			line := "nothing received waits to be applied"
			if l.Pending > 0 {
				line = fmt.Sprintf("the oldest change not yet applied committed %s ago", lagString(l.Pending))
			}
			if l.LastFlush != nil {
				line += fmt.Sprintf("; the last flush applied changes up to %s after their commit", lagString(*l.LastFlush))
			}
			fmt.Fprintf(tw, "apply lag\t%s\n", line)
		}
		if d.LastError != "" {
			fmt.Fprintf(tw, "daemon last error\t%s\n", d.LastError)
		}
		printReads(tw, d.FreshReads, d.Events)
		if len(d.StandbySlots) > 0 {
			fmt.Fprintf(tw, "standbys\t%s\n", standbysLine(d.StandbySlots, d.AckHeld))
		}
		if w := d.StandbyWait; w != nil {
			var slots []string
			for _, s := range w.Slots {
				state := "connected"
				if !s.Active {
					state = "no standby connected"
				}
				slots = append(slots, s.Slot+" ("+state+")")
			}
			fmt.Fprintf(tw, "standby wait\tPostgreSQL has held walcount's changes back for %s until %s confirm them\n", secondsAgo(w.Seconds), strings.Join(slots, ", "))
		}
		if w := d.SlotWait; w != nil {
			fmt.Fprintf(tw, "slot creation\twaiting %s for the transaction of pid %d (open %s) to end\n", secondsAgo(w.Waiting), w.PID, secondsAgo(w.Age))
		}
	}
	tw.Flush()
	for _, w := range r.Warnings {
		fmt.Fprintf(out, "WARNING: %s\n", w)
	}
}

// freshReadsLine sums up the daemon's fresh reads since it started: how
// many by result, how many waited for their min_lsn and how many of those
// timed out.
func freshReadsLine(f daemon.FreshReadStatus) string {
	if f.Reads == 0 {
		return "none since the daemon started"
	}
	var by []string
	for _, r := range metrics.Results {
		if n := f.Results[r]; n > 0 {
			by = append(by, fmt.Sprintf("%d %s", n, strings.ReplaceAll(r, "_", " ")))
		}
	}
	return fmt.Sprintf("%d since the daemon started (%s); %d waited for their min_lsn, %d timed out (504)",
		f.Reads, strings.Join(by, ", "), f.Waits, f.Timeouts)
}

// printReads prints the daemon's fresh reads and change events lines,
// each when the daemon has them.
func printReads(tw io.Writer, f *daemon.FreshReadStatus, e *daemon.EventsStatus) {
	if f != nil {
		fmt.Fprintf(tw, "fresh reads\t%s\n", freshReadsLine(*f))
	}
	if e != nil {
		fmt.Fprintf(tw, "change events\t%s\n", eventsLine(*e))
	}
}

// eventsLine sums up the change events: each counter's stream and its
// length, the bound, and what was published since the daemon started.
func eventsLine(e daemon.EventsStatus) string {
	if e.Off != "" {
		return "WARNING off: " + e.Off + "; the counters are kept as before (walcount check prints the ACL rule)"
	}
	var streams []string
	for _, s := range e.Streams {
		n := fmt.Sprintf("%d entries", s.Length)
		if s.Length < 0 {
			n = "length unknown"
		}
		streams = append(streams, s.Stream+" ("+n+")")
	}
	line := fmt.Sprintf("%s, each kept to about %d; %d published since the daemon started", strings.Join(streams, ", "), e.MaxLen, e.Published)
	if e.Recovered > 0 {
		line += fmt.Sprintf(", %d again after a crash", e.Recovered)
	}
	if e.Gaps > 0 {
		line += fmt.Sprintf(", %d gaps (redis lost walcount's keys)", e.Gaps)
	}
	if e.Error != "" {
		line += "; " + e.Error
	}
	return line
}

// dirtyCounter sums up one counter's dirty marks.
type dirtyCounter struct {
	name, what, cause string
	since             time.Time
}

// dirtyCounters groups dirty marks by counter, in the order of their first
// mark: the whole counter, or how many keys, with the oldest cause.
func dirtyCounters(marks []state.Dirty) []dirtyCounter {
	var out []dirtyCounter
	keys := map[string]int{}
	whole := map[string]bool{}
	for _, m := range marks {
		i := slices.IndexFunc(out, func(c dirtyCounter) bool { return c.name == m.Counter })
		if i < 0 {
			out = append(out, dirtyCounter{name: m.Counter, cause: m.Cause, since: m.Since})
			i = len(out) - 1
		}
		if m.Since.Before(out[i].since) {
			out[i].since, out[i].cause = m.Since, m.Cause
		}
		if m.Key == nil {
			whole[m.Counter] = true
		} else {
			keys[m.Counter]++
		}
	}
	for i := range out {
		if whole[out[i].name] {
			out[i].what = "the whole counter"
		} else {
			out[i].what = fmt.Sprintf("%d keys", keys[out[i].name])
		}
	}
	return out
}

// walStatusMeaning says what each pg_replication_slots.wal_status means
// for walcount.
var walStatusMeaning = map[string]string{
	slot.WALReserved:   "the slot's WAL is within max_wal_size",
	slot.WALExtended:   "the slot keeps more than max_wal_size, within max_slot_wal_keep_size",
	slot.WALUnreserved: "WAL the slot needs may be removed at the next checkpoint",
	slot.WALLost:       "WAL the slot needed was removed",
}

func walStatusLine(s slot.SlotStatus) string {
	status := s.WALStatus
	if status == "" {
		status = "null"
	}
	if s.Invalidated && s.InvalidationReason != "" && s.InvalidationReason != slot.ReasonWALRemoved {
		return fmt.Sprintf("%s (invalidated, invalidation_reason %s: %s)", status, s.InvalidationReason, slot.InvalidationMeaning(s.InvalidationReason))
	}
	if m, ok := walStatusMeaning[s.WALStatus]; ok {
		return status + " (" + m + ")"
	}
	if s.Invalidated {
		return status + " (the slot is invalidated)"
	}
	return status
}

// secondsAgo renders an age in seconds for people, to the second.
func secondsAgo(sec float64) string {
	return time.Duration(max(sec, 0) * float64(time.Second)).Round(time.Second).String()
}

// lagString renders a lag in seconds to the millisecond.
func lagString(sec float64) string {
	return time.Duration(max(sec, 0) * float64(time.Second)).Round(time.Millisecond).String()
}

// humanBytes renders n in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// standbysLine says which standbys' physical slots W waits for, and what
// waits.
func standbysLine(slots []string, held int64) string {
	have := "each have the"
	if len(slots) == 1 {
		have = "has the"
	}
	return fmt.Sprintf("W is confirmed once %s %s flush; %s waiting", strings.Join(slots, ", "), have, humanBytes(held))
}
