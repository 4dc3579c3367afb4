package metrics

import (
	"net/http"
	"regexp"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/walcount/walcount/internal/buildinfo"
)

// Namespace prefixes every walcount metric name.
const Namespace = "walcount"

// Label names.
const (
	// LabelCounter is the counter name from the configuration
	// (counter.Counter.Name).
	LabelCounter = "counter"
	// LabelOp is the kind of row change; one of the Op constants.
	LabelOp = "op"
	// LabelStatus is a pg_replication_slots.wal_status value.
	LabelStatus = "status"
	// LabelVersion, LabelRevision, LabelModified and LabelGoVersion are
	// walcount_build_info's: the fields of buildinfo.Info.
	LabelVersion   = "version"
	LabelRevision  = "revision"
	LabelModified  = "modified"
	LabelGoVersion = "goversion"
	// LabelReason is pg_replication_slots.invalidation_reason.
	LabelReason = "reason"
	// LabelStage is where a failed session was; one of the Stage
	// constants.
	LabelStage = "stage"
	// LabelResult is how a fresh read ended; one of Results.
	LabelResult = "result"
)

// Values of LabelResult.
const (
	ResultOK          = "ok"
	ResultNotFound    = "not_found"
	ResultTimeout     = "timeout"
	ResultUnavailable = "unavailable"
	ResultError       = "error"
)

// Results lists every value of LabelResult.
var Results = []string{ResultOK, ResultNotFound, ResultTimeout, ResultUnavailable, ResultError}

// Values of LabelStage. A session starts (it connects to PostgreSQL,
// takes the slot and makes the Redis buffer continue the checkpoint) and
// then streams (it reads the slot, writes deltas to Redis and flushes them
// to PostgreSQL). A Redis outage shows as one failure while streaming and
// then failures at start until Redis answers again.
const (
	StageStart     = "start"
	StageStreaming = "streaming"
)

// Stages lists every value of LabelStage.
var Stages = []string{StageStart, StageStreaming}

// Values of LabelOp.
const (
	OpInsert   = "insert"
	OpUpdate   = "update"
	OpDelete   = "delete"
	OpTruncate = "truncate"
)

// Ops lists every value of LabelOp.
var Ops = []string{OpInsert, OpUpdate, OpDelete, OpTruncate}

// Values of LabelStatus, in the order PostgreSQL documents them, from
// healthy to gone. "unreserved" means the slot's WAL is about to be removed at
// the next checkpoint; "lost" means it has been, and the slot is unusable.
const (
	WALStatusReserved   = "reserved"
	WALStatusExtended   = "extended"
	WALStatusUnreserved = "unreserved"
	WALStatusLost       = "lost"
)

// WALStatuses lists every value of LabelStatus.
var WALStatuses = []string{WALStatusReserved, WALStatusExtended, WALStatusUnreserved, WALStatusLost}

// Histogram buckets, in seconds.
var (
	// ApplyLagBuckets span 10 ms (a flush right after the commit) to 60 s
	// (a stalled sink), finer around the default flush interval of 1 s so
	// that a p99 target such as "flush interval + 250 ms" can be read off.
	ApplyLagBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 30, 60}
	// FreshReadBuckets span 0.5 ms (a read from memory-resident rows) to
	// 30 s (the longest min_lsn timeout).
	FreshReadBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// FlushDurationBuckets span 1 ms (a handful of keys) to 10 s (a large
	// backlog, or a lock wait on a hot row).
	FlushDurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// Metrics holds every metric walcount exports. Create it with New; the zero
// value is not usable. All fields are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	// Slot health, set by the slot monitor from pg_replication_slots.

	// SlotLagBytes is pg_current_wal_lsn() - confirmed_flush_lsn: WAL the
	// server has written that walcount has not yet acknowledged.
	SlotLagBytes prometheus.Gauge
	// SlotRetainedWALBytes is pg_current_wal_lsn() - restart_lsn: WAL the
	// slot keeps on the server's disk.
	SlotRetainedWALBytes prometheus.Gauge
	// SlotSafeWALSizeBytes is how much more WAL can be written before the
	// slot is in danger of losing WAL it needs; -1 when there is no limit
	// (max_slot_wal_keep_size = -1) or the server does not report one.
	SlotSafeWALSizeBytes prometheus.Gauge
	// SlotActive is 1 while a replication connection uses the slot.
	SlotActive prometheus.Gauge
	// SlotWALStatus is 1 for the slot's current wal_status and 0 for the
	// others; set it with SetWALStatus.
	SlotWALStatus *prometheus.GaugeVec
	// SlotInvalidated is 1, labelled with the reason PostgreSQL gives
	// (wal_removed, idle_timeout, rows_removed, ...), once the slot is
	// invalidated; it has no series while the slot is usable. Set it with
	// SetSlotInvalidated.
	SlotInvalidated *prometheus.GaugeVec

	// SlotSpillBytes, SlotSpillTxns, SlotStreamBytes and SlotStreamTxns
	// copy pg_stat_replication_slots, cumulative counters on the server:
	// they are exported as counters (with _total names) whose value is
	// the server's. They go back to zero when the statistics are reset
	// (pg_stat_reset_replication_slot), when the slot is recreated and
	// after a crash, which rate() and increase() take for a counter reset.
	SlotSpillBytes  *MirroredCounter
	SlotSpillTxns   *MirroredCounter
	SlotStreamBytes *MirroredCounter
	SlotStreamTxns  *MirroredCounter

	// SlotReadErrors counts failed reads of the slot's status.
	SlotReadErrors prometheus.Counter

	// Positions. An LSN is exported as the float64 of its uint64 value;
	// float64 is exact up to 2^53 bytes (8 PiB) of WAL, far beyond any
	// real server's lifetime.

	// CheckpointLSN is W, the LSN stored in walcount.checkpoint.
	CheckpointLSN prometheus.Gauge
	// ReceivedLSN is the end LSN of the last transaction received from the
	// replication stream.
	ReceivedLSN prometheus.Gauge
	// CheckpointAgeSeconds is the time since W last moved; the daemon sets
	// it, since only it knows when the last flush committed.
	CheckpointAgeSeconds prometheus.Gauge
	// AckHeldBytes is how far the W confirmed to the slot is behind the
	// W committed, waiting for the standbys named in
	// synchronized_standby_slots to flush it.
	AckHeldBytes prometheus.Gauge
	// StandbyWaitSeconds is how long the walsender has been holding
	// walcount's changes back for a standby named in
	// synchronized_standby_slots; 0 while it does not.
	StandbyWaitSeconds prometheus.Gauge

	// Stream.

	// Transactions counts committed source transactions received.
	Transactions prometheus.Counter
	// Changes counts row changes that matched a counter, by counter and op.
	Changes *prometheus.CounterVec
	// QueueBlockedSeconds is the total time the cdc stage spent blocked
	// on a full queue to the aggregator (backpressure, design rule 9).
	QueueBlockedSeconds prometheus.Counter
	// QueueDepth is the number of batches waiting in that queue.
	QueueDepth prometheus.Gauge
	// QueueBytes is the memory of the batches in that queue, which is
	// bounded by bytes, not only by batches.
	QueueBytes prometheus.Gauge
	// Streaming is 1 while the replication stream is connected. Setting
	// it to 1 also sets WaitingForSlot to 0: a walcount that streams has
	// its slot.
	Streaming prometheus.Gauge
	// WaitingForSlot is 1 while this walcount waits as a standby for the
	// slot another walcount holds; such an instance is meant not to
	// stream.
	WaitingForSlot prometheus.Gauge
	// SessionFailures counts replication sessions that failed and are
	// retried, whatever failed (PostgreSQL, Redis, the replication
	// connection), by stage (see StageStart).
	SessionFailures *prometheus.CounterVec
	// StreamTimeouts counts replication streams declared dead because
	// nothing, not even a keepalive, arrived within stream_timeout.
	StreamTimeouts prometheus.Counter

	// Flushes.

	// Flushes counts committed flushes to PostgreSQL.
	Flushes prometheus.Counter
	// FlushErrors counts flushes that failed and will be retried.
	FlushErrors prometheus.Counter
	// FlushPieces counts the transactions that applied carried deltas
	// without a hand-over: the pieces of a big batch (design rule 2).
	FlushPieces prometheus.Counter
	// FlushDuration is the duration of one flush, from hand-over to commit.
	FlushDuration prometheus.Histogram
	// DeltasFlushed counts non-zero deltas written, by counter.
	DeltasFlushed *prometheus.CounterVec
	// ExtremumRecomputes counts the max and min columns the flushes set
	// again from their source rows, by counter.
	ExtremumRecomputes *prometheus.CounterVec
	// DeltasDropped counts deltas whose target row did not exist, by
	// counter.
	DeltasDropped *prometheus.CounterVec
	// TargetRowsCreated counts target rows a create_missing counter's
	// flush created, by counter.
	TargetRowsCreated *prometheus.CounterVec
	// BufferKeys is the number of keys in the Redis buffer, and carried
	// by the flushes in walcount.carried.
	BufferKeys prometheus.Gauge
	// FlushKeysDeferred is the number of keys a flush carried to the next
	// because another transaction held their row locked; and
	// FlushOldestDeferredSeconds how long the oldest of them has been
	// carried (design rule 2).
	FlushKeysDeferred          prometheus.Gauge
	FlushOldestDeferredSeconds prometheus.Gauge
	// KeysParked is the number of keys whose UPDATE failed on their row's
	// data (a trigger, a CHECK) and that wait to be tried again.
	KeysParked prometheus.Gauge
	// ApplyLag is the time from a source transaction's commit to the commit
	// of the flush that contains its deltas.
	ApplyLag prometheus.Histogram

	// ForgedMessages counts walcount-prefixed logical messages that would
	// have acted on a count, the flush, the lifecycle handling or a
	// reconciliation, but did not come from walcount's table of messages:
	// sent by a role that is not walcount's (design rule 18). They are
	// ignored.
	ForgedMessages prometheus.Counter

	// Reconciliation (docs/design.md §5).

	// CounterDirty (walcount_dirty{counter}) is 1 for a counter walcount
	// cannot vouch for until a reconciliation repaired it (part of its
	// history was not seen), 0 otherwise. It was walcount_counter_dirty,
	// a name Prometheus's linter rejects: it holds a type word.
	CounterDirty *prometheus.GaugeVec
	// ReconcileCorrections counts corrections applied, by counter.
	ReconcileCorrections *prometheus.CounterVec
	// ReconcileKeysChecked counts keys measured, by counter.
	ReconcileKeysChecked *prometheus.CounterVec
	// ViaRowsCollected counts the via rows deleted because they hold
	// nothing any more (a deleted parent), by declared counter.
	ViaRowsCollected *prometheus.CounterVec

	// Fresh reads (docs/design.md §7).

	// FreshReads counts GET /v1/counters reads by result (LabelResult).
	FreshReads *prometheus.CounterVec
	// FreshReadSeconds is the time of a read, its min_lsn wait included.
	FreshReadSeconds prometheus.Histogram
	// FreshReadWaits counts reads that waited for their min_lsn, and
	// FreshReadWaitSeconds how long.
	FreshReadWaits       prometheus.Counter
	FreshReadWaitSeconds prometheus.Histogram
	// FreshReadRetries counts attempts a read made again (a batch written
	// in parts, a flush that committed between its two reads).
	FreshReadRetries prometheus.Counter
	// FreshReadNudges counts the heartbeats emitted for reads that waited
	// on a quiet database.
	FreshReadNudges prometheus.Counter

	// Change events (docs/design.md §7, "Change events").

	// EventsPublished counts the entries published to the counters'
	// change events streams, by counter.
	EventsPublished *prometheus.CounterVec
	// EventsRecovered counts the entries a session start published again
	// for a flush whose events a crash may have kept from Redis.
	EventsRecovered prometheus.Counter
	// EventsGaps counts the gap entries published: the chain was reset
	// (Redis lost walcount's keys, another server history), so entries
	// before it may be missing.
	EventsGaps prometheus.Counter
	// EventsStale counts the entries refused because their stream
	// already holds a later LSN (a walcount that lost its session to
	// another publishing late).
	EventsStale prometheus.Counter
	// EventsStreamLength is the length of a counter's stream after the
	// last publication, by counter.
	EventsStreamLength *prometheus.GaugeVec

	// BuildInfo is 1, labelled with what the binary is (version,
	// revision, modified, goversion); set it with SetBuildInfo.
	BuildInfo *prometheus.GaugeVec
}

// New returns a Metrics with every metric registered into a new registry,
// together with the Go runtime and process collectors.
//
// The slot's safe WAL size starts at -1 (unknown) rather than 0, so that an
// alert on a small safe size does not fire before the first slot read.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.newSlotMetrics()
	m.newPositionMetrics()
	m.newStreamMetrics()
	m.newFlushMetrics()
	m.newReconcileMetrics()
	m.newFreshMetrics()
	m.newEventsMetrics()
	m.BuildInfo = gaugeVec("build_info",
		"Always 1, labelled with the walcount version, the VCS revision it was built from, whether that tree was modified (true, false or unknown) and the Go version.",
		LabelVersion, LabelRevision, LabelModified, LabelGoVersion)

	m.reg.MustRegister(
		// The Go collector's defaults, and the heap live after the last
		// collection (go_gc_heap_live_bytes): what a leak grows, without
		// the garbage not yet collected that heap_inuse counts too.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.SlotLagBytes, m.SlotRetainedWALBytes, m.SlotSafeWALSizeBytes, m.SlotActive, m.SlotWALStatus, m.SlotInvalidated,
		m.SlotSpillBytes, m.SlotSpillTxns, m.SlotStreamBytes, m.SlotStreamTxns, m.SlotReadErrors,
		m.CheckpointLSN, m.ReceivedLSN, m.CheckpointAgeSeconds, m.AckHeldBytes, m.StandbyWaitSeconds,
		m.Transactions, m.Changes, m.QueueBlockedSeconds, m.QueueDepth, m.QueueBytes, m.Streaming,
		m.WaitingForSlot, m.SessionFailures, m.StreamTimeouts,
		m.Flushes, m.FlushErrors, m.FlushPieces, m.FlushDuration, m.DeltasFlushed, m.ExtremumRecomputes, m.DeltasDropped, m.TargetRowsCreated, m.BufferKeys, m.ApplyLag,
		m.ForgedMessages,
		m.FlushKeysDeferred, m.FlushOldestDeferredSeconds, m.KeysParked,
		m.CounterDirty, m.ReconcileCorrections, m.ReconcileKeysChecked, m.ViaRowsCollected,
		m.FreshReads, m.FreshReadSeconds, m.FreshReadWaits, m.FreshReadWaitSeconds, m.FreshReadRetries, m.FreshReadNudges,
		m.EventsPublished, m.EventsRecovered, m.EventsGaps, m.EventsStale, m.EventsStreamLength,
		m.BuildInfo,
	)

	m.SlotSafeWALSizeBytes.Set(-1)
	// Every status is exported from the start, so that an alert on
	// status="lost" == 1 has a series to evaluate and a dashboard shows 0
	// rather than "no data".
	for _, s := range WALStatuses {
		m.SlotWALStatus.WithLabelValues(s).Set(0)
	}
	// The same for failures: an alert on their increase needs the series
	// before the first one, or it misses that one.
	for _, s := range Stages {
		m.SessionFailures.WithLabelValues(s)
	}
	for _, r := range Results {
		m.FreshReads.WithLabelValues(r)
	}
	m.SetBuildInfo(buildinfo.Get())
	return m
}

// newSlotMetrics makes the slot's health metrics, which the slot monitor
// sets from pg_replication_slots.
func (m *Metrics) newSlotMetrics() {
	m.SlotLagBytes = gauge("slot_lag_bytes",
		"Bytes of WAL written by the server but not yet confirmed by walcount (pg_current_wal_lsn() - confirmed_flush_lsn).")
	m.SlotRetainedWALBytes = gauge("slot_retained_wal_bytes",
		"Bytes of WAL the replication slot keeps on the server (pg_current_wal_lsn() - restart_lsn).")
	m.SlotSafeWALSizeBytes = gauge("slot_safe_wal_size_bytes",
		"Bytes of WAL that can still be written before the slot risks losing WAL (pg_replication_slots.safe_wal_size); -1 when unlimited or unknown.")
	m.SlotActive = gauge("slot_active",
		"1 while a replication connection is using the slot, else 0.")
	m.SlotWALStatus = gaugeVec("slot_wal_status",
		"1 for the slot's current pg_replication_slots.wal_status (reserved, extended, unreserved, lost), 0 for the others.",
		LabelStatus)
	m.SlotInvalidated = gaugeVec("slot_invalidated",
		"1 once the replication slot is invalidated, labelled with the cause (pg_replication_slots.invalidation_reason: wal_removed, idle_timeout, rows_removed, wal_level_insufficient; unknown when the server does not say).",
		LabelReason)
	m.SlotSpillBytes = mirroredCounter("slot_spill_bytes_total",
		"Bytes of decoded transactions spilled to disk by the slot's walsender (pg_stat_replication_slots.spill_bytes, cumulative on the server).")
	m.SlotSpillTxns = mirroredCounter("slot_spill_txns_total",
		"Transactions spilled to disk by the slot's walsender (pg_stat_replication_slots.spill_txns, cumulative on the server).")
	m.SlotStreamBytes = mirroredCounter("slot_stream_bytes_total",
		"Bytes of in-progress transactions streamed by the slot's walsender (pg_stat_replication_slots.stream_bytes, cumulative on the server).")
	m.SlotStreamTxns = mirroredCounter("slot_stream_txns_total",
		"In-progress transactions streamed by the slot's walsender (pg_stat_replication_slots.stream_txns, cumulative on the server).")
	m.SlotReadErrors = counter("slot_read_errors_total",
		"Failed reads of the replication slot's status.")
}

// newPositionMetrics makes the metrics of the positions: W, the end of
// the last transaction received, what the standbys hold back.
func (m *Metrics) newPositionMetrics() {
	m.CheckpointLSN = gauge("checkpoint_lsn",
		"LSN stored in walcount.checkpoint (W): every source transaction up to it is in the counter columns.")
	m.ReceivedLSN = gauge("received_lsn",
		"End LSN of the last transaction received from the replication stream.")
	m.CheckpointAgeSeconds = gauge("checkpoint_age_seconds",
		"Seconds since the checkpoint LSN last moved.")
	m.StandbyWaitSeconds = gauge("standby_wait_seconds",
		"Seconds the walsender has been holding walcount's changes back until a standby named in synchronized_standby_slots confirms them (PostgreSQL 17+, wait event WaitForStandbyConfirmation); 0 while it does not.")
	m.AckHeldBytes = gauge("ack_held_bytes",
		"Bytes of WAL by which the position confirmed to the slot trails the checkpoint, held back until the standbys in synchronized_standby_slots have the flush that wrote it.")
}

// newStreamMetrics makes the metrics of the replication stream and of
// the queue behind it.
func (m *Metrics) newStreamMetrics() {
	m.Transactions = counter("transactions_total",
		"Committed source transactions received from the replication stream.")
	m.Changes = counterVec("changes_total",
		"Row changes that matched a counter, by counter and operation (insert, update, delete, truncate).",
		LabelCounter, LabelOp)
	m.QueueBlockedSeconds = counter("queue_blocked_seconds_total",
		"Seconds the replication reader spent blocked on a full queue to the aggregator (backpressure).")
	m.QueueDepth = gauge("queue_depth",
		"Batches of decoded changes waiting in the queue between the replication reader and the aggregator.")
	m.QueueBytes = gauge("queue_bytes",
		"Bytes of decoded changes held in the queue between the replication reader and the aggregator (bounded by bytes: backpressure starts at the bound).")
	m.WaitingForSlot = gauge("waiting_for_slot",
		"1 while this walcount waits as a standby for the replication slot another walcount holds, else 0.")
	m.SessionFailures = counterVec("session_failures_total",
		"Replication sessions that failed and are retried, whatever failed (PostgreSQL, Redis, the replication connection), by stage: start (connecting, taking the slot, recovering the Redis buffer) or streaming (reading the slot, writing deltas to Redis, flushing them).",
		LabelStage)
	m.StreamTimeouts = counter("stream_timeouts_total",
		"Replication streams abandoned because nothing, not even a keepalive, arrived within stream_timeout (a stopped walsender, a half-open connection); each is also a session failure.")
	m.ForgedMessages = counter("forged_messages_total",
		"Messages in walcount's form that did not come from walcount's table of messages (another role emitted them with pg_logical_emit_message); they were ignored.")
	m.Streaming = streamingGauge{
		Gauge:   gauge("streaming", "1 while the replication stream is connected, else 0."),
		waiting: m.WaitingForSlot,
	}
}

// newFlushMetrics makes the metrics of the flushes.
func (m *Metrics) newFlushMetrics() {
	m.Flushes = counter("flushes_total",
		"Flushes committed to PostgreSQL.")
	m.FlushErrors = counter("flush_errors_total",
		"Flushes that failed and will be retried.")
	m.FlushPieces = counter("flush_pieces_total",
		"Transactions that applied carried deltas in bounded pieces (a big batch, or what a stopped session left carried).")
	m.FlushDuration = histogram("flush_duration_seconds",
		"Duration of one flush, from taking over the Redis buffer to the PostgreSQL commit.",
		FlushDurationBuckets)
	m.DeltasFlushed = counterVec("deltas_flushed_total",
		"Non-zero deltas applied to counter columns, by counter.",
		LabelCounter)
	m.ExtremumRecomputes = counterVec("extremum_recomputes_total",
		"Max and min columns set again from their source rows by the flushes (one index probe each), by counter.",
		LabelCounter)
	m.DeltasDropped = counterVec("deltas_dropped_total",
		"Deltas dropped because their target row does not exist, by counter.",
		LabelCounter)
	m.TargetRowsCreated = counterVec("target_rows_created_total",
		"Target rows created by the flushes of create_missing counters, by counter.",
		LabelCounter)
	m.BufferKeys = gauge("buffer_keys",
		"Keys waiting in the Redis buffer or carried by the flushes to the next one.")
	m.FlushKeysDeferred = gauge("flush_keys_deferred",
		"Keys the last flush carried to the next because another transaction held their target row locked.")
	m.FlushOldestDeferredSeconds = gauge("flush_oldest_deferred_seconds",
		"How long the key carried the longest (its target row locked) has been carried; 0 when none is.")
	m.KeysParked = gauge("keys_parked",
		"Keys whose update failed on their target row's data (a trigger, a CHECK constraint); retried on a slow schedule.")
	m.ApplyLag = histogram("apply_lag_seconds",
		"Time from a source transaction's commit to the commit of the flush that applied its deltas.",
		ApplyLagBuckets)
}

// newReconcileMetrics makes the metrics of reconciliation.
func (m *Metrics) newReconcileMetrics() {
	m.CounterDirty = gaugeVec("dirty",
		"1 while a counter (or some of its keys) is dirty: part of its history was not seen, and walcount repairs it by reconciliation; 0 otherwise.",
		LabelCounter)
	m.ReconcileCorrections = counterVec("reconcile_corrections_total",
		"Corrections applied by reconciliation, by counter.",
		LabelCounter)
	m.ReconcileKeysChecked = counterVec("reconcile_keys_checked_total",
		"Keys measured by reconciliation, by counter.",
		LabelCounter)
	m.ViaRowsCollected = counterVec("via_rows_collected_total",
		"Rows of a via table deleted because they hold nothing any more (their parent was deleted and no source row references it), by counter through a parent.",
		LabelCounter)
}

// newFreshMetrics makes the metrics of fresh reads.
func (m *Metrics) newFreshMetrics() {
	m.FreshReads = counterVec("fresh_reads_total",
		"Fresh reads (GET /v1/counters), by result: ok, not_found, timeout (min_lsn not reached in time), unavailable (no consistent state in time), error.",
		LabelResult)
	m.FreshReadSeconds = histogram("fresh_read_seconds",
		"Time of a fresh read, its wait for min_lsn included.", FreshReadBuckets)
	m.FreshReadWaits = counter("fresh_read_waits_total",
		"Fresh reads that waited for walcount to read through their min_lsn.")
	m.FreshReadWaitSeconds = histogram("fresh_read_wait_seconds",
		"How long a fresh read waited for its min_lsn.", FreshReadBuckets)
	m.FreshReadRetries = counter("fresh_read_retries_total",
		"Attempts of fresh reads made again: a batch written to Redis in parts, or a flush that committed between the Redis and the PostgreSQL read.")
	m.FreshReadNudges = counter("fresh_read_nudges_total",
		"Heartbeats emitted so that fresh reads waiting for an LSN on a quiet database end.")
}

// newEventsMetrics makes the metrics of change events.
func (m *Metrics) newEventsMetrics() {
	m.EventsPublished = counterVec("events_published_total",
		"Entries published to the counters' change events streams, by counter.",
		LabelCounter)
	m.EventsRecovered = counter("events_recovered_total",
		"Change events published again by a session start, for flushes that committed without their events reaching Redis (a crash between the two).")
	m.EventsGaps = counter("events_gaps_total",
		"Gap entries published to the change events streams: walcount's Redis keys were lost or reset, so entries before the gap may be missing.")
	m.EventsStale = counter("events_stale_total",
		"Change events refused because their stream already held a later LSN.")
	m.EventsStreamLength = gaugeVec("events_stream_length",
		"Entries in a counter's change events stream after the last publication, by counter.",
		LabelCounter)
}

// Registry returns the registry holding every walcount metric.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// Registry makes the handler count its own errors
		// (promhttp_metric_handler_errors_total) in walcount's registry.
		Registry: m.reg,
		// ContinueOnError still serves the metrics that could be gathered
		// when one collector fails, rather than a blank 500.
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// SetBuildInfo sets walcount_build_info to 1 for in and drops any earlier
// series. New starts with the running binary's buildinfo.Get(); tests set
// their own.
func (m *Metrics) SetBuildInfo(in buildinfo.Info) {
	m.BuildInfo.Reset()
	m.BuildInfo.WithLabelValues(in.Version, in.Revision, in.Modified, in.GoVersion).Set(1)
}

// SetWALStatus sets walcount_slot_wal_status to 1 for status and to 0 for the
// others. An empty or unknown status (a missing slot, a slot that never
// reserved WAL) sets them all to 0.
func (m *Metrics) SetWALStatus(status string) {
	for _, s := range WALStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.SlotWALStatus.WithLabelValues(s).Set(v)
	}
}

// SetSlotInvalidated exports the slot's invalidation: reason is
// pg_replication_slots.invalidation_reason, "" for a usable slot (no
// series) and "unknown" when the server does not name a cause.
func (m *Metrics) SetSlotInvalidated(invalidated bool, reason string) {
	m.SlotInvalidated.Reset()
	if !invalidated {
		return
	}
	if reason == "" {
		reason = "unknown"
	}
	m.SlotInvalidated.WithLabelValues(reason).Set(1)
}

// InitCounter creates the labelled series of a configured counter at zero,
// so that they are exported before the first change arrives: rate() over a
// series that appears only with its first increment misses that increment,
// and a dashboard shows "no data" instead of 0.
func (m *Metrics) InitCounter(name string) {
	for _, op := range Ops {
		m.Changes.WithLabelValues(name, op)
	}
	m.DeltasFlushed.WithLabelValues(name)
	m.DeltasDropped.WithLabelValues(name)
	m.TargetRowsCreated.WithLabelValues(name)
	m.ReconcileCorrections.WithLabelValues(name)
	m.ReconcileKeysChecked.WithLabelValues(name)
	m.CounterDirty.WithLabelValues(name).Set(0)
}

// InitExtremum creates the labelled series of a max or min counter at
// zero (see InitCounter).
func (m *Metrics) InitExtremum(name string) { m.ExtremumRecomputes.WithLabelValues(name) }

// streamingGauge is walcount_streaming. A walcount that streams holds its
// slot, so setting it to 1 ends a wait for the slot: the daemon sets
// WaitingForSlot when a session finds the slot taken, and this clears it
// when a later session takes over.
type streamingGauge struct {
	prometheus.Gauge
	waiting prometheus.Gauge
}

func (g streamingGauge) Set(v float64) {
	if v == 1 {
		g.waiting.Set(0)
	}
	g.Gauge.Set(v)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets})
}

// MirroredCounter is a counter whose value is kept elsewhere (a server's
// cumulative statistic) and copied with Set.
type MirroredCounter struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	v    float64
}

func mirroredCounter(name, help string) *MirroredCounter {
	return &MirroredCounter{desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, nil, nil)}
}

// Set copies the source's value.
func (c *MirroredCounter) Set(v float64) {
	c.mu.Lock()
	c.v = v
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *MirroredCounter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *MirroredCounter) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	v := c.v
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, v)
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
}
