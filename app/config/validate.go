package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/redisconn"
)

// urlProblem is msg, url.Parse's complaint about raw, worded for a user,
// and only when it cannot quote a password: a password holding "/", "?"
// or "#" cuts the URL short, and the port url.Parse then quotes is a piece
// of it.
func urlProblem(raw, msg string) string {
	if p, ok := strings.CutPrefix(msg, "invalid port "); ok {
		port := strings.TrimSuffix(p, " after host")
		port, _ = strconv.Unquote(port)
		if i := strings.Index(raw, port); port == "" || i < 0 || strings.LastIndex(raw, "@") > i {
			return "invalid port, or a password holding / ? or # that is not percent-encoded (%2F %3F %23)"
		}
		return fmt.Sprintf("invalid port %q: the port must be a number, such as :5432", port)
	}
	if strings.Contains(msg, "@") || strings.Contains(msg, ":") {
		return "malformed URL" // could quote a piece of the password
	}
	return msg
}

// MaxFlushInterval bounds FlushInterval. Longer intervals hold the slot's
// confirmed position back for that long (W moves only on a flush, design
// rule 3), so WAL piles up and the counters look stale; an hour is already
// far past any useful coalescing.
const MaxFlushInterval = time.Hour

// MinStreamTimeout bounds StreamTimeout from below: walcount asks the
// server for a keepalive every third of the bound, and a bound of a few
// hundred milliseconds would declare a healthy stream on a busy host dead.
const MinStreamTimeout = time.Second

// MinFlushLockTime and MaxFlushLockTime bound FlushLockTime: below one
// statement's time every piece would be one statement, above a minute
// the application's waits would be what the setting is there to prevent.
const (
	MinFlushLockTime = 10 * time.Millisecond
	MaxFlushLockTime = time.Minute
)

// MinAggregatorTransactionKeys and MaxAggregatorTransactionKeys bound
// AggregatorTransactionKeys: below, a transaction would be written in
// many tiny parts; above, its memory would not be a bound any more.
const (
	MinAggregatorTransactionKeys = 100
	MaxAggregatorTransactionKeys = 10_000_000
	// MinEventsMaxLen and MaxEventsMaxLen bound EventsMaxLen, unless it
	// is 0 (change events off): below, a consumer would resume from the
	// columns after almost every burst; above, a stream would hold
	// gigabytes of Redis memory.
	MinEventsMaxLen = 100
	MaxEventsMaxLen = 100_000_000
)

var (
	// slotName is what PostgreSQL accepts as a replication slot name
	// (ReplicationSlotValidateName). Publication names are held to the
	// same rule so that both can be written unquoted in fixes and docs.
	slotName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// logLevels are the levels --log-level and log_level accept.
var logLevels = map[string]bool{"debug": true, "info": true, "warn": true, "error": true}

// Error is a configuration error. cmd/walcount exits with status 2 when
// errors.As finds one (docs/design.md §6). It lists every problem found, not only
// the first, so that one edit can fix them all.
type Error struct {
	Problems []Problem
}

// Problem is one thing wrong with the configuration.
type Problem struct {
	// Source is where the bad value came from: a file name, a flag
	// ("--slot") or an environment variable. Empty when not known.
	Source string
	// Line is the line in the file Source, or 0.
	Line int
	// Field is the setting's path in the file's terms, such as
	// "counters[1] (post_likes).key". Empty for problems of a whole file
	// and for flags and variables, whose name says it.
	Field string
	// Msg says what is wrong.
	Msg string
}

// String formats p as "source:line: field: message", leaving out the
// parts that are empty.
func (p Problem) String() string {
	var b strings.Builder
	if p.Source != "" {
		b.WriteString(p.Source)
		if p.Line > 0 {
			b.WriteString(":" + strconv.Itoa(p.Line))
		}
		b.WriteString(": ")
	} else if p.Line > 0 {
		b.WriteString("line " + strconv.Itoa(p.Line) + ": ")
	}
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error returns the problems one per line.
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Validate checks every setting and every counter and reports all problems
// as one *Error. It also puts each counter's Source and Target into
// canonical form ("schema.table", lower case, double quotes only where the
// name needs them), so that callers can compare them as strings; calling it
// again is harmless. Column names in a Counter are exact names as they are
// in pg_attribute (the file's loader has already folded them).
func (c *Config) Validate() error {
	var ps []Problem
	add := func(field, format string, args ...any) {
		ps = append(ps, Problem{Field: field, Msg: fmt.Sprintf(format, args...)})
	}

	c.validateConnections(add)
	c.validateTimings(add)
	c.validateServing(add)
	c.validateBlocks(add)

	for _, p := range counter.Validate(c.Counters) {
		ps = append(ps, Problem{Field: p.Field, Msg: p.Msg})
	}
	if len(ps) > 0 {
		return &Error{Problems: ps}
	}
	return nil
}

// problemFunc adds a problem with the setting field.
type problemFunc func(field, format string, args ...any)

// validateConnections checks the URLs and the names of the slot and the
// publication.
func (c *Config) validateConnections(add problemFunc) {
	checkPGURL := func(field, v string) {
		if !strings.Contains(v, "://") {
			return
		}
		// The URL is never repeated: it may hold a password.
		if u, err := url.Parse(v); err != nil {
			// url.Error's own error names the part that is wrong (an
			// invalid port, a character in the host) without the URL.
			why := ""
			var ue *url.Error
			if errors.As(err, &ue) {
				why = ": " + urlProblem(v, ue.Err.Error())
			}
			add(field, "not a valid URL%s", why)
		} else if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			add(field, "scheme %q is not postgres:// or postgresql://", u.Scheme)
		}
	}
	if c.DatabaseURL == "" {
		add("database_url", "required")
	} else {
		checkPGURL("database_url", c.DatabaseURL)
	}
	checkPGURL("replication_url", c.ReplicationURL)
	if c.RedisURL == "" {
		add("redis_url", "required")
	} else {
		c.validateRedis(add)
	}
	if !slotName.MatchString(c.Slot) {
		add("slot", "%q is not a valid slot name: use 1 to 63 lower-case letters, digits and underscores, not starting with a digit", c.Slot)
	}
	if !slotName.MatchString(c.Publication) {
		add("publication", "%q is not a valid publication name: use 1 to 63 lower-case letters, digits and underscores, not starting with a digit", c.Publication)
	}
}

// validateTimings checks the intervals and the bounds of the stream, the
// aggregator and the flush.
func (c *Config) validateTimings(add problemFunc) {
	if c.FlushInterval <= 0 || c.FlushInterval > MaxFlushInterval {
		add("flush_interval", "%s is out of range: must be more than 0 and at most %s", c.FlushInterval, MaxFlushInterval)
	}
	if c.HeartbeatInterval <= 0 {
		add("heartbeat_interval", "%s is out of range: must be more than 0", c.HeartbeatInterval)
	}
	if c.FlushLockTime < MinFlushLockTime || c.FlushLockTime > MaxFlushLockTime {
		add("flush_lock_time", "%s is out of range: must be at least %s and at most %s", c.FlushLockTime, MinFlushLockTime, MaxFlushLockTime)
	}
	if c.EventsMaxLen != 0 && (c.EventsMaxLen < MinEventsMaxLen || c.EventsMaxLen > MaxEventsMaxLen) {
		add("events_maxlen", "%d is out of range: must be 0 (change events off), or at least %d and at most %d", c.EventsMaxLen, MinEventsMaxLen, MaxEventsMaxLen)
	}
	if c.AggregatorTransactionKeys < MinAggregatorTransactionKeys || c.AggregatorTransactionKeys > MaxAggregatorTransactionKeys {
		add("aggregator_transaction_keys", "%d is out of range: must be at least %d and at most %d", c.AggregatorTransactionKeys, MinAggregatorTransactionKeys, MaxAggregatorTransactionKeys)
	}
	if c.StreamTimeout < 0 || (c.StreamTimeout > 0 && c.StreamTimeout < MinStreamTimeout) {
		add("stream_timeout", "%s is out of range: must be 0 (derived from wal_sender_timeout) or at least %s", c.StreamTimeout, MinStreamTimeout)
	}
}

// validateServing checks the HTTP API, the logs, the CPU scheduling and
// what to do on slot loss.
func (c *Config) validateServing(add problemFunc) {
	if c.HTTPAddr != "" {
		if _, port, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			add("http_addr", "%q is not host:port", c.HTTPAddr)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			add("http_addr", "%q has no valid port number", c.HTTPAddr)
		}
	}
	if !logLevels[c.LogLevel] {
		add("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	if c.LogFormat != LogFormatAuto && c.LogFormat != LogFormatConsole && c.LogFormat != LogFormatJSON {
		add("log_format", "%q is not one of auto, console, json", c.LogFormat)
	}
	// The token is a secret: the messages never repeat it.
	if strings.ContainsFunc(c.HTTPToken, func(r rune) bool { return r <= ' ' || r > '~' }) {
		add("http_token", "must be printable ASCII without spaces: it travels in an Authorization header")
	}
	if c.CPUScheduling != CPUSchedulingBatch && c.CPUScheduling != CPUSchedulingNormal {
		add("cpu_scheduling", "%q is not one of batch, normal", c.CPUScheduling)
	}
	if c.OnSlotLoss != SlotLossStop && c.OnSlotLoss != SlotLossRecreate {
		add("on_slot_loss", "%q is not one of stop, recreate", c.OnSlotLoss)
	}
}

// validateBlocks checks the slot_monitor and reconcile blocks.
func (c *Config) validateBlocks(add problemFunc) {
	if c.SlotSettings.PollInterval <= 0 {
		add("slot_monitor.poll_interval", "%s is out of range: must be more than 0", c.SlotSettings.PollInterval)
	}
	if c.SlotSettings.MaxLagBytes <= 0 {
		add("slot_monitor.max_lag_bytes", "%d is out of range: must be more than 0", c.SlotSettings.MaxLagBytes)
	}
	if c.Reconcile.BatchSize <= 0 {
		add("reconcile.batch_size", "%d is out of range: must be more than 0", c.Reconcile.BatchSize)
	}
	if c.Reconcile.Interval != nil && *c.Reconcile.Interval < 0 {
		add("reconcile.interval", "%s is out of range: must be 0 (off) or more", *c.Reconcile.Interval)
	}
	if c.Reconcile.MaxKeysPerSecond < 0 {
		add("reconcile.max_keys_per_second", "%d is out of range: must be 0 (no limit) or more", c.Reconcile.MaxKeysPerSecond)
	}
}

// validateRedis reports what is wrong with the Redis settings, each under
// the setting that causes it. Messages never repeat the URL: it may hold
// a password.
func (c *Config) validateRedis(add problemFunc) {
	tlsOpt := c.RedisTLS.Options()
	if _, err := redisconn.Parse(c.RedisURL, redisconn.TLSOptions{}); err != nil {
		add("redis_url", "%v", err)
		return
	}
	if tlsOpt.IsZero() && c.RedisSentinel == (RedisSentinel{}) {
		return
	}
	// The URL alone parses: what remains is the file's redis_tls and
	// redis_sentinel.
	o, err := redisconn.Parse(c.RedisURL, tlsOpt)
	if err != nil {
		add("redis_tls", "%v", err)
		return
	}
	if _, err := o.WithSentinelAuth(c.RedisSentinel.Username, c.RedisSentinel.Password); err != nil {
		add("redis_sentinel", "%v", err)
	}
}
