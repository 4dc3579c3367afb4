package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/walcount/walcount/internal/redact"
)

// Setting is one setting of walcount. Table declares each of them once:
// the loader (flag > environment > file > default), the command-line flags,
// walcount config's listing and the table of docs/configuration.md all
// read it, so that a new setting is one entry here plus its Config field
// (whose yaml tag is the Key) and its check in Validate.
type Setting struct {
	// Name is what people call the setting (the first column of the
	// documentation's table).
	Name string
	// Key is the configuration file key, dotted for a key in a block
	// (reconcile.max_keys_per_second); it is the path of yaml tags to the
	// Config field. Empty for --config itself.
	Key string
	// Flag is the command-line flag without its leading dashes; empty for
	// a setting only the file sets.
	Flag string
	// Env is walcount's environment variable: WALCOUNT_ and the flag in
	// upper case, dashes as underscores. Empty without a flag.
	Env string
	// Fallback is a conventional variable that platforms set for every
	// process (DATABASE_URL); it applies only when neither Env nor the
	// file sets the setting.
	Fallback string
	// Default is the default, as the help and the documentation show it.
	Default string
	// Help is the flag's help, before the variable, key and default that
	// settingHelp adds.
	Help string
	// Doc is the meaning column of docs/configuration.md's table of flags.
	Doc string
	// Values are the values of a setting that takes one of a fixed set;
	// shell completion offers them.
	Values []string
	// RunOnly marks a setting that only walcount run reads; its flag
	// belongs to that command alone. Command names the one other command
	// whose flag it is (reconcile for max-keys-per-second).
	RunOnly bool
	Command string
	// Secret marks a value that is never shown, not even in errors; URL
	// marks a URL whose password is masked when it is shown; Bare marks a
	// text shown unquoted (names and the values of a fixed set).
	Secret, URL, Bare bool
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

// Table is every setting, once, in the order of deploy/walcount.example.yaml
// (--config first). The file's counters are not in it: they are a list, not
// a setting.
var Table = []Setting{
	{Name: "config file", Flag: "config", Env: EnvConfig, Default: "none", Help: "YAML config file",
		Doc: "The YAML file described below."},
	{Name: "PostgreSQL URL", Key: "database_url", Flag: "database-url", Env: EnvDatabaseURL, Fallback: EnvDatabaseURLFallback,
		Default: DefaultDatabaseURL, URL: true, Help: "PostgreSQL URL",
		Doc: "The database whose WAL walcount follows. `DATABASE_URL` is a fallback below the file (see below)."},
	{Name: "replication URL", Key: "replication_url", Flag: "replication-url", Env: EnvReplicationURL,
		Default: "the database URL", URL: true,
		Help: "PostgreSQL URL of the replication connection (the slot), when the database URL goes through a pooler",
		Doc:  "The replication connection (the slot's stream) and the slot's creation. Set it when `database_url` goes through a connection pooler such as PgBouncer: a replication connection cannot be pooled, so it must reach PostgreSQL directly. It may name a hot standby of PostgreSQL 16 or later: the slot then lives and decodes there (see [operations: decoding on a standby](operations.md#decoding-on-a-standby))."},
	{Name: "Redis URL", Key: "redis_url", Flag: "redis-url", Env: EnvRedisURL, Fallback: EnvRedisURLFallback,
		Default: DefaultRedisURL, URL: true, Help: "Redis URL",
		Doc: "Where deltas are buffered. `REDIS_URL` is a fallback below the file."},
	{Name: "Redis CA file", Key: "redis_tls.ca_file", Default: "none"},
	{Name: "Redis client certificate", Key: "redis_tls.cert_file", Default: "none"},
	{Name: "Redis client key", Key: "redis_tls.key_file", Default: "none"},
	{Name: "Redis server name", Key: "redis_tls.server_name", Default: "none"},
	{Name: "Redis insecure TLS", Key: "redis_tls.insecure_skip_verify", Default: "false"},
	{Name: "Sentinel user", Key: "redis_sentinel.username", Default: "none"},
	{Name: "Sentinel password", Key: "redis_sentinel.password", Default: "none", Secret: true},
	{Name: "replication slot", Key: "slot", Flag: "slot", Env: EnvSlot, Default: DefaultSlot, Bare: true,
		Help: "logical replication slot", Doc: "The logical replication slot; one walcount per slot."},
	{Name: "publication", Key: "publication", Flag: "publication", Env: EnvPublication, Default: DefaultPublication, Bare: true,
		Help: "publication", Doc: "The publication the slot reads."},
	{Name: "flush interval", Key: "flush_interval", Flag: "flush-interval", Env: EnvFlushInterval, Default: DefaultFlushInterval.String(),
		Help: "how often deltas are applied to PostgreSQL", Doc: "How often buffered deltas are applied to PostgreSQL."},
	{Name: "heartbeat interval", Key: "heartbeat_interval", Default: DefaultHeartbeatInterval.String()},
	{Name: "stream timeout", Key: "stream_timeout", Default: "0"},
	{Name: "flush lock time", Key: "flush_lock_time", Default: DefaultFlushLockTime.String()},
	{Name: "aggregator transaction keys", Key: "aggregator_transaction_keys", Default: strconv.Itoa(DefaultAggregatorTransactionKeys)},
	{Name: "change events stream length", Key: "events_maxlen", Default: strconv.Itoa(DefaultEventsMaxLen)},
	{Name: "HTTP address", Key: "http_addr", Flag: "http-addr", Env: EnvHTTPAddr, Default: DefaultHTTPAddr,
		Help: "HTTP API address: run serves /metrics, /healthz, /readyz, /status and POST /v1/reconcile there; status and reconcile ask the daemon there",
		Doc:  "Where `run` serves the HTTP API, and where `status` and `reconcile` look for the daemon."},
	{Name: "HTTP token", Key: "http_token", Flag: "http-token", Env: EnvHTTPToken, Default: "none", Secret: true,
		Help: "bearer token POST /v1/reconcile requires when set; prefer the variable, a command line is visible to other users",
		Doc:  "A bearer token that `POST /v1/reconcile` requires when set; `walcount reconcile` sends it."},
	{Name: "log level", Key: "log_level", Flag: "log-level", Env: EnvLogLevel, Default: "info", Bare: true,
		Values: []string{"debug", "info", "warn", "error"},
		Help:   "debug, info, warn or error", Doc: "`debug`, `info`, `warn` or `error`."},
	{Name: "log format", Key: "log_format", Flag: "log-format", Env: EnvLogFormat, Default: LogFormatAuto, Bare: true,
		Values: []string{LogFormatAuto, LogFormatConsole, LogFormatJSON},
		Help:   "auto (console on a terminal, JSON otherwise), console or json",
		Doc:    "`console` (for people), `json` (one object per line), or `auto`: console when stderr is a terminal, JSON otherwise."},
	{Name: "CPU scheduling (`run`)", Key: "cpu_scheduling", Flag: "cpu-scheduling", Env: EnvCPUScheduling, Default: CPUSchedulingBatch,
		RunOnly: true, Bare: true, Values: []string{CPUSchedulingBatch, CPUSchedulingNormal},
		Help: "batch (Linux SCHED_BATCH: never preempt a database backend on a shared host) or normal",
		Doc:  "`batch` or `normal`; see the settings table below."},
	{Name: "slot loss (`run`)", Key: "on_slot_loss", Flag: "on-slot-loss", Env: EnvOnSlotLoss, Default: SlotLossStop,
		RunOnly: true, Bare: true, Values: []string{SlotLossStop, SlotLossRecreate},
		Help: "what to do when the slot is lost or invalidated: stop (exit 1 for an operator) or recreate (a new slot, every counter marked dirty and reconciled)",
		Doc:  "`stop` or `recreate`; see the settings table below."},
	{Name: "slot poll interval", Key: "slot_monitor.poll_interval", Default: "5s"},
	{Name: "slot lag bound", Key: "slot_monitor.max_lag_bytes", Default: "1073741824"},
	{Name: "reconcile batch size", Key: "reconcile.batch_size", Default: "100000"},
	{Name: "reconcile interval", Key: "reconcile.interval", Default: "24h"},
	// walcount run paces its runs with it; the flag is walcount
	// reconcile's, for the run it starts.
	{Name: "reconcile rate limit (`reconcile`, `run`)", Key: "reconcile.max_keys_per_second", Flag: "max-keys-per-second",
		Env: EnvMaxKeysPerSecond, Default: "0", Command: "reconcile",
		Help: "at most this many keys read per second by this run, 0 for no limit; unset, the daemon's own limit applies",
		Doc:  "At most this many target keys read per second by a reconciliation; `0` means no limit. `run` paces its runs with it (the flag is `reconcile`'s); see the settings table below."},
}

// Settings are the settings a flag sets, in the order the help and the
// documentation list them: the entries of Table with a Flag.
var Settings = func() []Setting {
	var out []Setting
	for _, s := range Table {
		if s.Key != "" {
			if _, err := s.field(&Config{}); err != nil {
				panic("config.Table: " + err.Error())
			}
		}
		if s.Flag != "" {
			out = append(out, s)
		}
	}
	return out
}()

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

// field returns the Config field that s.Key names, by the yaml tags of
// Config and of its blocks.
func (s Setting) field(c *Config) (reflect.Value, error) {
	v := reflect.ValueOf(c).Elem()
	for part := range strings.SplitSeq(s.Key, ".") {
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, fmt.Errorf("setting %s: %s is not a block", s.Key, v.Type())
		}
		found := false
		for i := range v.NumField() {
			if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ","); tag == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, fmt.Errorf("setting %s: no field of Config has the yaml key %q", s.Key, part)
		}
	}
	return v, nil
}

var durationType = reflect.TypeOf(time.Duration(0))

// Set parses the text form of the value, as an environment variable or a
// flag holds it, into c.
func (s Setting) Set(c *Config, text string) error {
	v, err := s.field(c)
	if err != nil {
		return err
	}
	if v.Kind() == reflect.Pointer {
		p := reflect.New(v.Type().Elem())
		if err := setValue(p.Elem(), text); err != nil {
			return err
		}
		v.Set(p)
		return nil
	}
	return setValue(v, text)
}

func setValue(v reflect.Value, text string) error {
	switch {
	case v.Type() == durationType:
		var d time.Duration
		if err := setDuration(&d, text); err != nil {
			return err
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(text)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a whole number", text)
		}
		v.SetInt(n)
	case v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return fmt.Errorf("%q is not true or false", text)
		}
		v.SetBool(b)
	default:
		return fmt.Errorf("a setting of type %s cannot be set from text", v.Type())
	}
	return nil
}

// Kind is how a flag holds the setting: "string", "duration", "int" or
// "bool".
func (s Setting) Kind() string {
	v, err := s.field(&Config{})
	if err != nil {
		return "string"
	}
	t := v.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		return "int"
	case t.Kind() == reflect.Bool:
		return "bool"
	}
	return "string"
}

// Show is the value of the setting in c as walcount config prints it:
// durations and numbers as they are, texts quoted (Bare ones not), URLs
// with their password masked, secrets as whether they are set. An unset
// optional value (reconcile.interval) shows its default.
func (s Setting) Show(c Config) string {
	v, err := s.field(&c)
	if err != nil {
		return ""
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			if d, err := time.ParseDuration(s.Default); err == nil {
				return d.String() + " (default)"
			}
			return s.Default + " (default)"
		}
		v = v.Elem()
	}
	switch {
	case s.Secret:
		if v.String() == "" {
			return `""`
		}
		return "xxxxx (set)"
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.String && s.URL:
		return strconv.Quote(redact.URL(v.String()))
	case v.Kind() == reflect.String && s.Bare:
		return v.String()
	case v.Kind() == reflect.String:
		return strconv.Quote(v.String())
	}
	return fmt.Sprint(v.Interface())
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
