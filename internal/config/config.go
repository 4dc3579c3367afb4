package config

import (
	"time"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/monitor"
	"github.com/walcount/walcount/reconcile"
)

// Defaults of the settings. Each is documented in README.md.
const (
	DefaultDatabaseURL       = "postgres://postgres@localhost:5432/postgres"
	DefaultRedisURL          = "redis://localhost:6379/0"
	DefaultSlot              = "walcount"
	DefaultPublication       = "walcount"
	DefaultFlushInterval     = time.Second
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultHTTPAddr          = "127.0.0.1:9750"
	// CPUSchedulingBatch and CPUSchedulingNormal are the values of
	// cpu_scheduling; batch is the default.
	CPUSchedulingBatch  = "batch"
	CPUSchedulingNormal = "normal"
)

// Config is everything walcount run needs. The zero value is not usable:
// start from Default and override.
type Config struct {
	// DatabaseURL is the PostgreSQL connection URL (libpq URL or DSN).
	DatabaseURL string `yaml:"database_url"`
	// RedisURL is the Redis URL (redis://[user:pass@]host:port/db).
	RedisURL string `yaml:"redis_url"`
	// Slot is the logical replication slot name.
	Slot string `yaml:"slot"`
	// Publication is the publication name.
	Publication string `yaml:"publication"`
	// FlushInterval is how often buffered deltas are applied to PostgreSQL.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// HeartbeatInterval is how often an idle stream emits a heartbeat
	// message so that W and the slot keep moving (DESIGN §2 rule 8).
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// HTTPAddr is the listen address of /metrics, /healthz, /readyz,
	// /status and /v1/reconcile. Empty disables the HTTP server.
	HTTPAddr string `yaml:"http_addr"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// CPUScheduling is how walcount run asks Linux to schedule its
	// threads: "batch" (SCHED_BATCH: a fair share of CPU, but a thread
	// that wakes up does not preempt a running one, such as a database
	// backend holding a lock, when they share a host) or "normal".
	CPUScheduling string `yaml:"cpu_scheduling"`
	// Counters are the counter caches to maintain; empty means
	// []counter.Counter{counter.Default()}.
	Counters []counter.Counter `yaml:"counters"`
	// SlotSettings tune slot monitoring.
	SlotSettings SlotSettings `yaml:"slot_monitor"`
	// Reconcile tunes reconciliation.
	Reconcile ReconcileSettings `yaml:"reconcile"`
}

// SlotSettings tune slot monitoring.
type SlotSettings struct {
	// PollInterval is how often pg_replication_slots is read; default 5s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxLagBytes is the lag above which /readyz fails; default 1 GiB.
	MaxLagBytes int64 `yaml:"max_lag_bytes"`
}

// ReconcileSettings tune reconciliation (DESIGN §5).
type ReconcileSettings struct {
	// BatchSize is how many target keys one measurement reads; default 1000.
	BatchSize int `yaml:"batch_size"`
	// Interval is the pause between scheduled runs; default 24h, 0 disables.
	Interval *time.Duration `yaml:"interval"`
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		DatabaseURL:       DefaultDatabaseURL,
		RedisURL:          DefaultRedisURL,
		Slot:              DefaultSlot,
		Publication:       DefaultPublication,
		FlushInterval:     DefaultFlushInterval,
		HeartbeatInterval: DefaultHeartbeatInterval,
		HTTPAddr:          DefaultHTTPAddr,
		LogLevel:          "info",
		CPUScheduling:     CPUSchedulingBatch,
		Counters:          []counter.Counter{counter.Default()},
		SlotSettings: SlotSettings{
			PollInterval: monitor.DefaultPollInterval,
			MaxLagBytes:  monitor.DefaultMaxLagBytes,
		},
		Reconcile: ReconcileSettings{BatchSize: reconcile.DefaultBatchSize},
	}
}
