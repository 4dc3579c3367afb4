package config

import (
	"fmt"
	"strconv"
	"time"
)

// Setting is one setting that a command-line flag, an environment variable
// and a configuration file key can each set. Settings lists them all, so
// that the flags' help, the loader and the documentation cannot drift
// apart.
type Setting struct {
	// Key is the configuration file key; empty for --config itself.
	Key string
	// Flag is the command-line flag without its leading dashes.
	Flag string
	// Env is walcount's environment variable: WALCOUNT_ and the flag in
	// upper case, dashes as underscores.
	Env string
	// Fallback is a conventional variable that platforms set for every
	// process (DATABASE_URL); it applies only when neither Env nor the
	// file sets the setting.
	Fallback string
	// Default is the default, as the help and the documentation show it.
	Default string
	// RunOnly marks a setting that only walcount run reads; its flag
	// belongs to that command alone.
	RunOnly bool
	// Secret marks a value that is never shown, not even in errors.
	Secret bool

	// set parses the text form of the value, as an environment variable
	// holds it, into c.
	set func(c *Config, v string) error
}

// Environment variables read by Load. docs/design.md §6 fixes the first three
// names; the others follow the same rule (see Setting.Env).
const (
	EnvConfig      = "WALCOUNT_CONFIG"
	EnvDatabaseURL = "WALCOUNT_DATABASE_URL"
	EnvRedisURL    = "WALCOUNT_REDIS_URL"
	// EnvReplicationURL is the URL of the replication connection.
	EnvReplicationURL = "WALCOUNT_REPLICATION_URL"
	// EnvDatabaseURLFallback and EnvRedisURLFallback are the conventional
	// names that platforms (Heroku, Render, docker compose files) set;
	// the WALCOUNT_ names and the file win over them.
	EnvDatabaseURLFallback = "DATABASE_URL"
	EnvRedisURLFallback    = "REDIS_URL"
	EnvSlot                = "WALCOUNT_SLOT"
	EnvPublication         = "WALCOUNT_PUBLICATION"
	EnvFlushInterval       = "WALCOUNT_FLUSH_INTERVAL"
	EnvHTTPAddr            = "WALCOUNT_HTTP_ADDR"
	EnvHTTPToken           = "WALCOUNT_HTTP_TOKEN"
	EnvLogLevel            = "WALCOUNT_LOG_LEVEL"
	EnvLogFormat           = "WALCOUNT_LOG_FORMAT"
	EnvCPUScheduling       = "WALCOUNT_CPU_SCHEDULING"
	EnvOnSlotLoss          = "WALCOUNT_ON_SLOT_LOSS"
	EnvMaxKeysPerSecond    = "WALCOUNT_MAX_KEYS_PER_SECOND"
)

// Settings are the settings a flag sets, in the order the help and the
// documentation list them.
var Settings = []Setting{
	{Flag: "config", Env: EnvConfig, Default: "none"},
	{Key: "database_url", Flag: "database-url", Env: EnvDatabaseURL, Fallback: EnvDatabaseURLFallback, Default: DefaultDatabaseURL,
		set: func(c *Config, v string) error { c.DatabaseURL = v; return nil }},
	{Key: "replication_url", Flag: "replication-url", Env: EnvReplicationURL, Default: "the database URL",
		set: func(c *Config, v string) error { c.ReplicationURL = v; return nil }},
	{Key: "redis_url", Flag: "redis-url", Env: EnvRedisURL, Fallback: EnvRedisURLFallback, Default: DefaultRedisURL,
		set: func(c *Config, v string) error { c.RedisURL = v; return nil }},
	{Key: "slot", Flag: "slot", Env: EnvSlot, Default: DefaultSlot,
		set: func(c *Config, v string) error { c.Slot = v; return nil }},
	{Key: "publication", Flag: "publication", Env: EnvPublication, Default: DefaultPublication,
		set: func(c *Config, v string) error { c.Publication = v; return nil }},
	{Key: "flush_interval", Flag: "flush-interval", Env: EnvFlushInterval, Default: DefaultFlushInterval.String(),
		set: func(c *Config, v string) error { return setDuration(&c.FlushInterval, v) }},
	{Key: "http_addr", Flag: "http-addr", Env: EnvHTTPAddr, Default: DefaultHTTPAddr,
		set: func(c *Config, v string) error { c.HTTPAddr = v; return nil }},
	{Key: "http_token", Flag: "http-token", Env: EnvHTTPToken, Default: "none", Secret: true,
		set: func(c *Config, v string) error { c.HTTPToken = v; return nil }},
	{Key: "log_level", Flag: "log-level", Env: EnvLogLevel, Default: "info",
		set: func(c *Config, v string) error { c.LogLevel = v; return nil }},
	{Key: "log_format", Flag: "log-format", Env: EnvLogFormat, Default: LogFormatAuto,
		set: func(c *Config, v string) error { c.LogFormat = v; return nil }},
	{Key: "cpu_scheduling", Flag: "cpu-scheduling", Env: EnvCPUScheduling, Default: CPUSchedulingBatch, RunOnly: true,
		set: func(c *Config, v string) error { c.CPUScheduling = v; return nil }},
	{Key: "on_slot_loss", Flag: "on-slot-loss", Env: EnvOnSlotLoss, Default: SlotLossStop, RunOnly: true,
		set: func(c *Config, v string) error { c.OnSlotLoss = v; return nil }},
	// walcount run paces its runs with it; the flag is walcount
	// reconcile's, for the run it starts.
	{Key: "reconcile.max_keys_per_second", Flag: "max-keys-per-second", Env: EnvMaxKeysPerSecond, Default: "0",
		set: func(c *Config, v string) error { return setInt(&c.Reconcile.MaxKeysPerSecond, v) }},
}

// SettingKey returns the key of the Setting that a field path of the file
// belongs to: the path itself for a nested setting
// (reconcile.max_keys_per_second), else its top-level key.
func SettingKey(field string) string {
	for _, s := range Settings {
		if s.Key != "" && s.Key == field {
			return field
		}
	}
	return topField(field)
}

// SettingByFlag returns the setting of a flag (without its dashes).
func SettingByFlag(flag string) (Setting, bool) {
	for _, s := range Settings {
		if s.Flag == flag {
			return s, true
		}
	}
	return Setting{}, false
}

// setInt parses a whole number.
func setInt(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%q is not a whole number", v)
	}
	*dst = n
	return nil
}

// setDuration parses a duration written as the file writes it (1s, 500ms).
func setDuration(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%q is not a duration (write it like 1s, 500ms or 1h)", v)
	}
	*dst = d
	return nil
}

// PostgresSessionSettings are sent at the start of every PostgreSQL
// connection walcount run and walcount check open (they win over the
// settings of the database and the role): no statement or lock wait is
// cut short by a setting of the database or the role (ALTER ROLE ... SET
// statement_timeout = '1ms' must not wedge walcount; reconciliation's
// surveys take seconds), and a transaction left idle, which could hold
// row locks the app waits for, ends after a minute. The flush sets
// tighter bounds in its own transaction (package sink).
var PostgresSessionSettings = map[string]string{
	"lock_timeout":                        "0",
	"statement_timeout":                   "0",
	"idle_in_transaction_session_timeout": "60s",
}

// SessionSettings returns the startup settings for c's SQL connections:
// PostgresSessionSettings, or none when database_url goes through a pooler
// (PooledSQL). PgBouncer refuses unknown startup parameters, and a
// session's settings would not follow a transaction from one server
// connection to the next anyway; the flush still sets its own bounds in
// each of its transactions, but other statements then run with the role's
// settings.
func (c Config) SessionSettings() map[string]string {
	if c.PooledSQL() {
		return nil
	}
	return PostgresSessionSettings
}
