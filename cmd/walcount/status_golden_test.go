package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/testkit/golden"
	"github.com/walcount/walcount/sink"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// TestStatusGolden holds what walcount status prints, as text and as
// --json, for fixed readings of the servers (no server runs: the report
// is a function of what runStatus read) to testdata/status_<case>.txt and
// .json: a healthy daemon, a slot nobody reads with everything an operator
// must look at (dirty counters, carried and parked keys, a Redis that may
// evict), a daemon that runs and does not stream, a lost slot, a missing
// one, and one past max_slot_wal_keep_size. The counters are those of
// golden's representative configuration. Every reading is of a fixed
// instant; only the ages that printStatus takes from the clock itself (a
// parked key's and a dirty mark's, from their fixed time) are replaced by
// a placeholder. Run it with -update to rewrite the files,
// and review their diff.
func TestStatusGolden(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	lsn := func(s string) pglogrepl.LSN {
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	i64 := func(n int64) *int64 { return &n }
	f64 := func(f float64) *float64 { return &f }
	str := func(s string) *string { return &s }
	daemonJSON := func(s daemon.Status) json.RawMessage {
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	checkpoint := func(r *statusReport, w string, age float64) {
		at := at.Add(-time.Duration(age * float64(time.Second)))
		r.Checkpoint, r.CheckpointAt, r.CheckpointAge = w, &at, &age
	}
	healthySlot := slot.SlotStatus{Slot: "walcount", Exists: true, Plugin: "pgoutput", SlotType: "logical", Database: "app",
		Active: true, ActivePID: 4242, WALStatus: slot.WALReserved, SafeWALSizeBytes: i64(2 << 30),
		LagBytes: 12 << 10, RetainedWALBytes: 3 << 19,
		ConfirmedFlushLSN: lsn("1/2A3B4C50"), RestartLSN: lsn("1/2A248C50"), CurrentLSN: lsn("1/2A3B7C50"), ReadAt: at}
	inactiveSlot := healthySlot
	inactiveSlot.Active, inactiveSlot.ActivePID = false, 0
	inactiveSlot.WALStatus, inactiveSlot.SafeWALSizeBytes = slot.WALExtended, nil
	inactiveSlot.LagBytes, inactiveSlot.RetainedWALBytes = 300<<20, 301<<20
	inactiveSince := at.Add(-10 * time.Minute)
	inactiveSlot.InactiveSince = &inactiveSince

	tests := []struct {
		name     string
		httpAddr string
		report   statusReport
		json     bool
	}{
		{name: "streaming", httpAddr: "127.0.0.1:9187", json: true, report: func() statusReport {
			r := statusReport{Slot: healthySlot, Carried: &state.CarriedSummary{}, RedisLSN: "1/2A3B6C50", BufferKeys: i64(37), FlushInProgress: true}
			checkpoint(&r, "1/2A3B4C50", 0.4)
			r.Daemon = daemonJSON(daemon.Status{Slot: "walcount", Publication: "walcount", Streaming: true,
				Checkpoint: "1/2A3B4C50", CheckpointAge: f64(0.4), Received: "1/2A3B7C50",
				StandbySlots: []string{"standby1"}, AckHeldBytes: 4096,
				ApplyLag: sink.ApplyLag{PendingSeconds: 0.25, LastFlushSeconds: f64(0.812)},
				Counters: []daemon.CounterStatus{}})
			return r
		}()},
		{name: "inactive", json: true, report: func() statusReport {
			r := statusReport{Slot: inactiveSlot, WalcountSessions: i64(0),
				RedisEviction: buffer.Eviction{Policy: "allkeys-lru", MaxMemory: 1 << 30}.String() + "; fix: " + buffer.EvictionFix}
			checkpoint(&r, "1/2A3B4C50", 612)
			r.Dirty = []state.Dirty{
				{ID: 1, Counter: "post_score", Cause: "backfill", Since: at.Add(-2 * time.Hour)},
				{ID: 2, Counter: "tag_posts", Key: str("7"), Cause: "parked", Since: at.Add(-20 * time.Minute)},
				{ID: 3, Counter: "tag_posts", Key: str("9"), Cause: "parked", Since: at.Add(-25 * time.Minute)},
			}
			r.Carried = &state.CarriedSummary{Deferred: 2, Parked: 3, OldestAge: 245,
				Oldest: &state.Carried{Counter: "post_likes", Key: "12", Delta: 3, Since: at.Add(-245 * time.Second)},
				ParkedKeys: []state.Carried{{Counter: "user_karma", Key: "17", Delta: -2, Since: at.Add(-90 * time.Second),
					Parked: `ERROR: new row for relation "users" violates check constraint "karma_range" (SQLSTATE 23514)`}}}
			return r
		}()},
		{name: "sessions", httpAddr: "127.0.0.1:9187", report: func() statusReport {
			r := statusReport{Slot: inactiveSlot, WalcountSessions: i64(2), Carried: &state.CarriedSummary{},
				DaemonError: "no daemon answers at 127.0.0.1:9187 (dial tcp 127.0.0.1:9187: connect: connection refused); if it listens elsewhere, point at it with --http-addr or WALCOUNT_HTTP_ADDR"}
			checkpoint(&r, "1/2A3B4C50", 30)
			return r
		}()},
		{name: "not_streaming", httpAddr: "127.0.0.1:9187", report: func() statusReport {
			r := statusReport{Slot: inactiveSlot, Carried: &state.CarriedSummary{}, RedisLSN: "1/2A3B6C50", BufferKeys: i64(5)}
			checkpoint(&r, "1/2A3B4C50", 75)
			r.Daemon = daemonJSON(daemon.Status{Slot: "walcount", Publication: "walcount", Failures: 3,
				LastError: "replication: ERROR: replication slot \"walcount\" is active for PID 999 (SQLSTATE 55006)",
				Degraded:  []string{"post_comments"},
				StandbyWait: &daemon.StandbyWait{Since: at.Add(-42 * time.Second), Seconds: 42,
					Slots: []daemon.StandbySlotWait{{Slot: "standby1", Exists: true, Active: true}, {Slot: "standby2", Exists: true, BehindBytes: 8192}}},
				SlotCreationWait: &daemon.SlotCreationWait{Since: at.Add(-15 * time.Second), WaitingSeconds: 15, PID: 31337, XactAgeSeconds: 3600},
				Counters:         []daemon.CounterStatus{}})
			return r
		}()},
		{name: "lost", report: func() statusReport {
			s := inactiveSlot
			s.Invalidated, s.WALStatus, s.InvalidationReason = true, slot.WALLost, slot.ReasonIdleTimeout
			s.RestartLSN, s.RetainedWALBytes = 0, 0
			r := statusReport{Slot: s, WalcountSessions: i64(0), Carried: &state.CarriedSummary{}}
			checkpoint(&r, "1/2A3B4C50", 86400)
			return r
		}()},
		{name: "missing", report: statusReport{Slot: slot.SlotStatus{Slot: "walcount", CurrentLSN: lsn("1/2A3B7C50"), ReadAt: at},
			CheckpointError: "no checkpoint (walcount is not set up: no schema walcount); run walcount setup",
			RedisError:      "dial tcp 127.0.0.1:6379: connect: connection refused"}},
		{name: "past_limit", report: func() statusReport {
			s := inactiveSlot
			s.WALStatus, s.SafeWALSizeBytes = slot.WALUnreserved, i64(-(5 << 20))
			r := statusReport{Slot: s, WalcountSessions: i64(0), Carried: &state.CarriedSummary{}}
			checkpoint(&r, "1/2A3B4C50", 3600)
			return r
		}()},
	}
	clock := golden.Replacer{{Pattern: regexp.MustCompile(`since [0-9hms.]+ ago`), Placeholder: "since <age> ago"}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.HTTPAddr = tt.httpAddr
			// What runStatus does with its readings.
			r := tt.report
			r.Warnings = statusWarnings(r, cfg.HTTPAddr)
			var text bytes.Buffer
			printStatus(&text, cfg, r)
			fmt.Fprintf(&text, "(exit code %d)\n", map[bool]int{true: exitFailure, false: exitOK}[len(r.Warnings) > 0])
			golden.Check(t, "status_"+tt.name+".txt", []byte(clock.Apply(text.String())))
			if tt.json {
				var out bytes.Buffer
				enc := json.NewEncoder(&out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(r); err != nil {
					t.Fatal(err)
				}
				golden.Check(t, "status_"+tt.name+".json", out.Bytes())
			}
		})
	}
}
