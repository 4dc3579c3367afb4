package config

import (
	"strings"
	"time"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/slot"
)

// Defaults of the settings. Each is documented in README.md.
const (
	DefaultDatabaseURL       = "postgres://postgres@localhost:5432/postgres"
	DefaultRedisURL          = "redis://localhost:6379/0"
	DefaultSlot              = "walcount"
	DefaultPublication       = "walcount"
	DefaultFlushInterval     = time.Second
	DefaultHeartbeatInterval = 10 * time.Second

	// DefaultFlushLockTime is flush_lock_time's default.
	DefaultFlushLockTime = 200 * time.Millisecond
	// DefaultAggregatorTransactionKeys is aggregator_transaction_keys's
	// default: about 25 MiB of one source transaction's deltas.
	DefaultAggregatorTransactionKeys = 50000
	// DefaultEventsMaxLen is events_maxlen's default: about how many
	// change events each counter's stream keeps.
	DefaultEventsMaxLen = 100000

	DefaultHTTPAddr = "127.0.0.1:9750"
	// CPUSchedulingBatch and CPUSchedulingNormal are the values of
	// cpu_scheduling; batch is the default.
	CPUSchedulingBatch  = "batch"
	CPUSchedulingNormal = "normal"
	// SlotLossStop and SlotLossRecreate are the values of on_slot_loss;
	// stop is the default.
	SlotLossStop     = "stop"
	SlotLossRecreate = "recreate"
	// LogFormatAuto, LogFormatConsole and LogFormatJSON are the values of
	// log_format. auto, the default, is console on a terminal and JSON
	// otherwise.
	LogFormatAuto    = "auto"
	LogFormatConsole = "console"
	LogFormatJSON    = "json"
)

// Config is everything walcount run needs. The zero value is not usable:
// start from Default and override.
type Config struct {
	// DatabaseURL is the PostgreSQL connection URL (libpq URL or DSN).
	DatabaseURL string `yaml:"database_url"`
	// ReplicationURL is the PostgreSQL URL of the replication connection
	// (the slot's stream) and of the slot's creation; empty means
	// DatabaseURL. It lets the SQL pool go through a connection pooler
	// (PgBouncer in transaction mode) while the slot is read directly:
	// a replication connection cannot be pooled.
	ReplicationURL string `yaml:"replication_url"`
	// RedisURL is the Redis URL: a single node, a cluster or a
	// Sentinel-watched primary (see package redisconn for the forms).
	RedisURL string `yaml:"redis_url"`
	// RedisTLS are the TLS settings of a rediss URL; the URL's query
	// parameters of the same names win over them.
	RedisTLS RedisTLS `yaml:"redis_tls"`
	// RedisSentinel are the sentinels' own credentials for a
	// redis+sentinel URL; the URL's sentinel_username and
	// sentinel_password win over them.
	RedisSentinel RedisSentinel `yaml:"redis_sentinel"`
	// Slot is the logical replication slot name.
	Slot string `yaml:"slot"`
	// Publication is the publication name.
	Publication string `yaml:"publication"`
	// FlushInterval is how often buffered deltas are applied to PostgreSQL.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// HeartbeatInterval is how often an idle stream emits a heartbeat
	// message so that W and the slot keep moving (design rule 8).
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// StreamTimeout is how long the replication stream may stay silent
	// (no data, no keepalive) before it is declared dead and the session
	// restarts. 0, the default, derives it from the server's
	// wal_sender_timeout (see cdc.SilenceBound).
	StreamTimeout time.Duration `yaml:"stream_timeout"`
	// FlushLockTime is how long one flush transaction goes on updating
	// counter rows, which it holds locked until its commit, before it
	// commits and the batch goes on in another (design rule 2).
	FlushLockTime time.Duration `yaml:"flush_lock_time"`
	// AggregatorTransactionKeys bounds the distinct keys of one source
	// transaction walcount holds in memory: past it, the transaction's
	// deltas so far are written to Redis before its COMMIT, in parts that
	// only its COMMIT makes part of the chain.
	AggregatorTransactionKeys int `yaml:"aggregator_transaction_keys"`
	// EventsMaxLen bounds each counter's change events stream (XADD …
	// MAXLEN ~): about how many entries it keeps. 0 turns change events
	// off (docs/fresh-reads.md, "Change events").
	EventsMaxLen int64 `yaml:"events_maxlen"`
	// HTTPAddr is the listen address of /metrics, /healthz, /readyz,
	// /status and /v1/reconcile. Empty disables the HTTP server.
	HTTPAddr string `yaml:"http_addr"`
	// HTTPToken, when not empty, is the bearer token that POST requests
	// to the HTTP API must carry. It is a secret: never log or show it.
	HTTPToken string `yaml:"http_token"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// LogFormat is auto, console or json (see LogFormatAuto).
	LogFormat string `yaml:"log_format"`
	// CPUScheduling is how walcount run asks Linux to schedule its
	// threads: "batch" (SCHED_BATCH: a fair share of CPU, but a thread
	// that wakes up does not preempt a running one, such as a database
	// backend holding a lock, when they share a host) or "normal".
	CPUScheduling string `yaml:"cpu_scheduling"`
	// OnSlotLoss is what walcount run does when its slot is lost or
	// missing (invalidated, or gone after a failover to a standby that
	// had no copy): "stop" (the default: stop with the fix) or "recreate"
	// (recreate the slot, mark every counter dirty and reconcile it).
	OnSlotLoss string `yaml:"on_slot_loss"`
	// Counters are the counter caches to maintain; empty means
	// []counter.Counter{counter.Default()}.
	Counters []counter.Counter `yaml:"-"`
	// SlotSettings tune slot monitoring.
	SlotSettings SlotSettings `yaml:"slot_monitor"`
	// Reconcile tunes reconciliation.
	Reconcile ReconcileSettings `yaml:"reconcile"`

	// File is the configuration file Load read, empty when none was
	// given. It is not a setting: it lets messages say whether a value
	// came from a file or from the defaults.
	File string `yaml:"-"`
	// Origin maps a setting's key (database_url, reconcile.max_keys_per_second;
	// a key of the file: slot_monitor, counters) to where Load took it
	// from: a flag (--slot), an environment variable (WALCOUNT_SLOT) or
	// the file (its path). A key it lacks has its default. See OriginOf.
	Origin map[string]string `yaml:"-"`
}

// OriginOf says where the setting key came from, for messages: "flag
// --database-url", "environment variable WALCOUNT_DATABASE_URL", "config
// file walcount.yaml" or "default".
func (c Config) OriginOf(key string) string {
	o, ok := c.Origin[key]
	switch {
	case !ok:
		return "default"
	case strings.HasPrefix(o, "--"):
		return "flag " + o
	case o == c.File && c.File != "":
		return "config file " + o
	default:
		return "environment variable " + o
	}
}

// RedisTLS are the TLS settings of a rediss, rediss+cluster or
// rediss+sentinel URL (see redisconn.TLSOptions).
type RedisTLS struct {
	// CAFile is a PEM file of the CAs that sign the servers'
	// certificates; empty means the system's.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and its key, for
	// servers that demand one.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the servers' certificates must carry; empty
	// means the host dialled.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate; walcount check
	// warns while it is on.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Options returns the settings in redisconn's terms.
func (t RedisTLS) Options() redisconn.TLSOptions {
	return redisconn.TLSOptions{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

// RedisSentinel are the credentials walcount gives the sentinels, which
// may differ from the data nodes' (Sentinel's requirepass or its ACL).
type RedisSentinel struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// RedisOptions parses RedisURL with RedisTLS and RedisSentinel into what
// redisconn.New needs. Validate reports the same errors, each under the
// setting that causes it.
func (c Config) RedisOptions() (redisconn.Options, error) {
	o, err := redisconn.Parse(c.RedisURL, c.RedisTLS.Options())
	if err != nil {
		return redisconn.Options{}, err
	}
	return o.WithSentinelAuth(c.RedisSentinel.Username, c.RedisSentinel.Password)
}

// SlotSettings tune slot monitoring.
type SlotSettings struct {
	// PollInterval is how often pg_replication_slots is read; default 5s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxLagBytes is the lag above which /readyz fails; default 1 GiB.
	MaxLagBytes int64 `yaml:"max_lag_bytes"`
}

// ReconcileSettings tune reconciliation (docs/design.md §5).
type ReconcileSettings struct {
	// BatchSize is how many target keys one measurement reads; default
	// reconcile.DefaultBatchSize (100000).
	BatchSize int `yaml:"batch_size"`
	// Interval is the pause between scheduled runs; default 24h, 0 disables.
	Interval *time.Duration `yaml:"interval"`
	// MaxKeysPerSecond paces every run: at most that many target keys are
	// read per second. 0, the default, means no limit.
	MaxKeysPerSecond int `yaml:"max_keys_per_second"`
}

// ReplicationConnString is the URL of the replication connection:
// ReplicationURL, else DatabaseURL.
func (c Config) ReplicationConnString() string {
	if c.ReplicationURL != "" {
		return c.ReplicationURL
	}
	return c.DatabaseURL
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		DatabaseURL:               DefaultDatabaseURL,
		RedisURL:                  DefaultRedisURL,
		Slot:                      DefaultSlot,
		Publication:               DefaultPublication,
		FlushInterval:             DefaultFlushInterval,
		HeartbeatInterval:         DefaultHeartbeatInterval,
		FlushLockTime:             DefaultFlushLockTime,
		AggregatorTransactionKeys: DefaultAggregatorTransactionKeys,
		EventsMaxLen:              DefaultEventsMaxLen,
		HTTPAddr:                  DefaultHTTPAddr,
		LogLevel:                  "info",
		LogFormat:                 LogFormatAuto,
		CPUScheduling:             CPUSchedulingBatch,
		OnSlotLoss:                SlotLossStop,
		Counters:                  []counter.Counter{counter.Default()},
		SlotSettings: SlotSettings{
			PollInterval: slot.DefaultPollInterval,
			MaxLagBytes:  slot.DefaultMaxLagBytes,
		},
		Reconcile: ReconcileSettings{BatchSize: reconcile.DefaultBatchSize},
	}
}
