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
)

// MaxFlushInterval bounds FlushInterval. Longer intervals hold the slot's
// confirmed position back for that long (W moves only on a flush, DESIGN §2
// rule 3), so WAL piles up and the counters look stale; an hour is already
// far past any useful coalescing.
const MaxFlushInterval = time.Hour

// maxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are truncated by
// the server, so a longer name in the file could never match a catalog entry.
const maxIdentLen = 63

var (
	// counterName is what a counter name may look like: it appears in
	// metric labels, log fields and Redis hash fields.
	counterName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	// slotName is what PostgreSQL accepts as a replication slot name
	// (ReplicationSlotValidateName). Publication names are held to the
	// same rule so that both can be written unquoted in fixes and docs.
	slotName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	// plainIdent is an unquoted SQL identifier; PostgreSQL folds it to
	// lower case.
	plainIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)
	// canonicalIdent is an identifier that needs no quotes in the
	// canonical "schema.table" form.
	canonicalIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)
)

// logLevels are the levels --log-level and log_level accept.
var logLevels = map[string]bool{"debug": true, "info": true, "warn": true, "error": true}

// Error is a configuration error. cmd/walcount exits with status 2 when
// errors.As finds one (DESIGN §6). It lists every problem found, not only
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

	if c.DatabaseURL == "" {
		add("database_url", "required")
	} else if strings.Contains(c.DatabaseURL, "://") {
		// The URL is never repeated: it may hold a password.
		if u, err := url.Parse(c.DatabaseURL); err != nil {
			add("database_url", "not a valid URL")
		} else if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			add("database_url", "scheme %q is not postgres:// or postgresql://", u.Scheme)
		}
	}
	if c.RedisURL == "" {
		add("redis_url", "required")
	} else if u, err := url.Parse(c.RedisURL); err != nil {
		add("redis_url", "not a valid URL")
	} else if u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix" {
		add("redis_url", "scheme %q is not redis://, rediss:// or unix://", u.Scheme)
	}
	if !slotName.MatchString(c.Slot) {
		add("slot", "%q is not a valid slot name: use 1 to 63 lower-case letters, digits and underscores, not starting with a digit", c.Slot)
	}
	if !slotName.MatchString(c.Publication) {
		add("publication", "%q is not a valid publication name: use 1 to 63 lower-case letters, digits and underscores, not starting with a digit", c.Publication)
	}
	if c.FlushInterval <= 0 || c.FlushInterval > MaxFlushInterval {
		add("flush_interval", "%s is out of range: must be more than 0 and at most %s", c.FlushInterval, MaxFlushInterval)
	}
	if c.HeartbeatInterval <= 0 {
		add("heartbeat_interval", "%s is out of range: must be more than 0", c.HeartbeatInterval)
	}
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
	if c.CPUScheduling != CPUSchedulingBatch && c.CPUScheduling != CPUSchedulingNormal {
		add("cpu_scheduling", "%q is not one of batch, normal", c.CPUScheduling)
	}
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

	ps = append(ps, validateCounters(c.Counters)...)
	if len(ps) > 0 {
		return &Error{Problems: ps}
	}
	return nil
}

// validateCounters checks the counters and canonicalises their tables in
// place.
func validateCounters(cs []Counter) []Problem {
	var ps []Problem
	names := map[string]int{}
	// written maps "target.column" to the index of the counter writing it.
	written := map[string]int{}

	for i := range cs {
		c := &cs[i]
		field := counterField(i, c.Name)
		add := func(sub, format string, args ...any) {
			ps = append(ps, Problem{Field: field + "." + sub, Msg: fmt.Sprintf(format, args...)})
		}

		switch {
		case c.Name == "":
			add("name", "required")
		case !counterName.MatchString(c.Name):
			add("name", "%q must be 1 to 63 lower-case letters, digits and underscores, starting with a letter", c.Name)
		default:
			if j, dup := names[c.Name]; dup {
				add("name", "also used by counters[%d]: names must be unique", j)
			} else {
				names[c.Name] = i
			}
		}

		table := func(sub string, v *string) bool {
			if *v == "" {
				add(sub, "required")
				return false
			}
			schema, tbl, err := parseTable(*v)
			if err != nil {
				add(sub, "%v", err)
				return false
			}
			*v = canonicalTable(schema, tbl)
			return true
		}
		table("source", &c.Source)
		tgtOK := table("target", &c.Target)

		column := func(sub, v string, required bool) {
			switch {
			case v == "" && required:
				add(sub, "required")
			case v == "":
			case len(v) > maxIdentLen:
				add(sub, "%q is longer than %d bytes", v, maxIdentLen)
			case strings.ContainsRune(v, 0):
				add(sub, "contains a NUL byte")
			}
		}
		column("key", c.Key, true)
		column("target_key", c.TargetKey, true)
		column("column", c.Column, true)
		column("sum", c.Sum, false)
		for k := range c.Where {
			column("where."+k, k, true)
		}

		if tgtOK && c.Column != "" {
			if c.Column == c.TargetKey {
				add("column", "%q is also the target_key", c.Column)
			}
			w := c.Target + "." + c.Column
			if j, dup := written[w]; dup {
				add("column", "%s is already written by counters[%d] (%s): two counters cannot write one column", w, j, cs[j].Name)
			} else {
				written[w] = i
			}
		}
	}

	// A counter column must not feed a counter: if it were a key, filter or
	// summed column of a counted table, every flush would change the rows
	// being counted and the counts would chase their own tail through the
	// WAL forever.
	for i, c := range cs {
		for j, d := range cs {
			if c.Target != d.Source || c.Column == "" {
				continue
			}
			_, inWhere := d.Where[c.Column]
			if c.Column == d.Key || c.Column == d.Sum || inWhere {
				ps = append(ps, Problem{
					Field: counterField(i, c.Name) + ".column",
					Msg:   fmt.Sprintf("%s.%s is read by counters[%d] (%s): a counter column cannot be a key, sum or where column of a counted table", c.Target, c.Column, j, d.Name),
				})
			}
		}
	}
	return ps
}

// counterField names counter i in problems: "counters[1] (post_likes)".
func counterField(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("counters[%d]", i)
	}
	return fmt.Sprintf("counters[%d] (%s)", i, name)
}

// SplitTable splits a table name of the configuration into schema and
// table. An unqualified name is in schema public. Unquoted parts are folded
// to lower case as PostgreSQL does; double-quoted parts are kept as they
// are ("My""Table" is My"Table). Names that Validate rejects are returned
// as they are, in schema public.
func SplitTable(name string) (schema, table string) {
	s, t, err := parseTable(name)
	if err != nil {
		return "public", name
	}
	return s, t
}

// SourceTable returns the schema and table of c.Source.
func (c Counter) SourceTable() (schema, table string) { return SplitTable(c.Source) }

// TargetTable returns the schema and table of c.Target.
func (c Counter) TargetTable() (schema, table string) { return SplitTable(c.Target) }

// parseTable parses "table" or "schema.table", each part a plain or a
// double-quoted identifier.
func parseTable(name string) (schema, table string, err error) {
	parts, err := splitQualified(name)
	if err != nil {
		return "", "", fmt.Errorf("%q is not a table name: %w", name, err)
	}
	switch len(parts) {
	case 1:
		return "public", parts[0], nil
	case 2:
		return parts[0], parts[1], nil
	default:
		return "", "", fmt.Errorf("%q is not a table name: want table or schema.table", name)
	}
}

// parseIdent parses one plain or double-quoted identifier and returns the
// name PostgreSQL would store.
func parseIdent(s string) (string, error) {
	parts, err := splitQualified(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a column name: %w", s, err)
	}
	if len(parts) != 1 {
		return "", fmt.Errorf("%q is not a column name: it must not be qualified", s)
	}
	return parts[0], nil
}

// splitQualified splits a dotted name into identifiers.
func splitQualified(s string) ([]string, error) {
	var parts []string
	for {
		var part string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(s[i:], '"')
				if j < 0 {
					return nil, errors.New("unterminated double quote")
				}
				b.WriteString(s[i : i+j])
				i += j + 1
				if i < len(s) && s[i] == '"' { // "" is an escaped quote
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			part, s = b.String(), s[i:]
			if part == "" {
				return nil, errors.New("empty quoted identifier")
			}
		} else {
			end := strings.IndexByte(s, '.')
			if end < 0 {
				end = len(s)
			}
			part, s = s[:end], s[end:]
			if !plainIdent.MatchString(part) {
				return nil, fmt.Errorf("%q is not an identifier: use letters, digits, _ and $, or double quotes", part)
			}
			part = strings.ToLower(part)
		}
		if len(part) > maxIdentLen {
			return nil, fmt.Errorf("%q is longer than %d bytes", part, maxIdentLen)
		}
		parts = append(parts, part)
		if s == "" {
			return parts, nil
		}
		if s[0] != '.' {
			return nil, errors.New("unexpected text after a quoted identifier")
		}
		s = s[1:]
	}
}

// canonicalTable writes schema.table, quoting a part only when an unquoted
// form would read differently.
func canonicalTable(schema, table string) string {
	return canonicalIdentText(schema) + "." + canonicalIdentText(table)
}

func canonicalIdentText(s string) string {
	if canonicalIdent.MatchString(s) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
