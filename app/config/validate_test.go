package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/slot"
)

func TestParseErrors(t *testing.T) {
	// counter returns a valid counter block with one field replaced or
	// (value "-") removed.
	counter := func(name string, repl map[string]string) string {
		fields := []struct{ k, v string }{
			{"name", name}, {"source", "public.likes"}, {"key", "post_id"},
			{"target", "public.posts"}, {"target_key", "id"}, {"column", "likes_count"},
		}
		var b strings.Builder
		first := true
		for _, f := range fields {
			v := f.v
			if r, ok := repl[f.k]; ok {
				v = r
			}
			if v == "-" {
				continue
			}
			if first {
				first = false
				b.WriteString("  - ")
			} else {
				b.WriteString("    ")
			}
			b.WriteString(f.k + ": " + v + "\n")
		}
		for k, v := range repl {
			if k == "sum" || k == "where" || k == "target_row" || k == "max" || k == "min" {
				b.WriteString("    " + k + ": " + v + "\n")
			}
		}
		return b.String()
	}
	tests := []struct {
		name string
		yaml string
		want []string // one entry per expected problem line, in order
	}{
		{"name required", "counters:\n" + counter("-", nil),
			[]string{"walcount.yaml: counters[0].name: required"}},
		{"name invalid", "counters:\n" + counter("Post-Likes", nil),
			[]string{`walcount.yaml: counters[0] (Post-Likes).name: "Post-Likes" must be 1 to 63 lower-case letters`}},
		{"name duplicate", "counters:\n" + counter("a", nil) + counter("a", map[string]string{"column": "other"}),
			[]string{"walcount.yaml: counters[1] (a).name: also used by counters[0]: names must be unique"}},
		{"source required", "counters:\n" + counter("a", map[string]string{"source": "-"}),
			[]string{"walcount.yaml: counters[0] (a).source: required"}},
		{"source invalid", "counters:\n" + counter("a", map[string]string{"source": "my-table"}),
			[]string{`walcount.yaml: counters[0] (a).source: "my-table" is not a table name`}},
		{"source too qualified", "counters:\n" + counter("a", map[string]string{"source": "db.public.likes"}),
			[]string{`walcount.yaml: counters[0] (a).source: "db.public.likes" is not a table name: want table or schema.table`}},
		{"source unterminated quote", "counters:\n" + counter("a", map[string]string{"source": `'"likes'`}),
			[]string{`walcount.yaml: counters[0] (a).source: "\"likes" is not a table name: unterminated double quote`}},
		{"target required", "counters:\n" + counter("a", map[string]string{"target": "-"}),
			[]string{"walcount.yaml: counters[0] (a).target: required"}},
		{"key required", "counters:\n" + counter("post_likes", map[string]string{"key": "-"}),
			[]string{"walcount.yaml: counters[0] (post_likes).key: required"}},
		{"key invalid", "counters:\n" + counter("a", map[string]string{"key": "post id"}),
			[]string{`walcount.yaml: counters[0] (a).key: "post id" is not a column name`}},
		{"key qualified", "counters:\n" + counter("a", map[string]string{"key": "likes.post_id"}),
			[]string{`walcount.yaml: counters[0] (a).key: "likes.post_id" is not a column name: it must not be qualified`}},
		{"target_key required", "counters:\n" + counter("a", map[string]string{"target_key": "-"}),
			[]string{"walcount.yaml: counters[0] (a).target_key: required"}},
		{"column required", "counters:\n" + counter("a", map[string]string{"column": "-"}),
			[]string{"walcount.yaml: counters[0] (a).column: required"}},
		{"column is target key", "counters:\n" + counter("a", map[string]string{"column": "id"}),
			[]string{`walcount.yaml: counters[0] (a).column: "id" is also the target_key`}},
		{"sum invalid", "counters:\n" + counter("a", map[string]string{"sum": "1x"}),
			[]string{`walcount.yaml: counters[0] (a).sum: "1x" is not a column name`}},
		{"two counters write one column", "counters:\n" + counter("a", nil) + counter("b", map[string]string{"target": "Posts"}),
			[]string{"walcount.yaml: counters[1] (b).column: public.posts.likes_count is already written by counters[0] (a): two counters cannot write one column"}},
		{"counter column feeds a counter", "counters:\n" + counter("a", nil) +
			counter("b", map[string]string{"source": "posts", "key": "likes_count", "target": "users", "column": "n"}),
			[]string{"walcount.yaml: counters[0] (a).column: public.posts.likes_count is read by counters[1] (b): a counter column cannot be a key, max, min or where column of a counted table (only a sum may read it)"}},
		{"counter columns summed in a cycle", "counters:\n" +
			counter("a", map[string]string{"source": "users", "key": "id", "sum": "total", "target": "posts", "column": "likes_count"}) +
			counter("b", map[string]string{"source": "posts", "key": "id", "sum": "likes_count", "target": "users", "column": "total"}),
			[]string{"walcount.yaml: counters[0] (a).sum: the counters sum each other's columns in a cycle (a → b → a): every flush would change the column it is computed from"}},
		{"a counter sums its own column", "counters:\n" +
			counter("a", map[string]string{"source": "posts", "key": "id", "sum": "likes_count", "target": "posts", "column": "likes_count"}),
			[]string{"walcount.yaml: counters[0] (a).sum: the counters sum each other's columns in a cycle (a → a)"}},
		{"where list with null", "counters:\n" + counter("a", map[string]string{"where": "{state: [1, null]}"}),
			[]string{"walcount.yaml:8: counters[0] (a).where.state: a list cannot hold null"}},
		{"where empty list", "counters:\n" + counter("a", map[string]string{"where": "{state: {not: []}}"}),
			[]string{"walcount.yaml:8: counters[0] (a).where.state: the list is empty, and would match no row"}},
		{"where nested list", "counters:\n" + counter("a", map[string]string{"where": "{state: [[1]]}"}),
			[]string{"walcount.yaml:8: counters[0] (a).where.state: a list holds values only"}},
		{"max and min", "counters:\n" + counter("a", map[string]string{"max": "created_at", "min": "created_at"}),
			[]string{"walcount.yaml: counters[0] (a).min: a counter keeps max or min, not both: declare two counters"}},
		{"sum and max", "counters:\n" + counter("a", map[string]string{"sum": "n", "max": "created_at"}),
			[]string{"walcount.yaml: counters[0] (a).sum: a counter keeps a sum or an extremum (max, min), not both: declare two counters"}},
		{"max of a counter column", "counters:\n" + counter("a", nil) +
			counter("b", map[string]string{"source": "posts", "key": "author_id", "max": "likes_count", "target": "users", "column": "top"}),
			[]string{"walcount.yaml: counters[0] (a).column: public.posts.likes_count is read by counters[1] (b): a counter column cannot be a key, max, min or where column of a counted table (only a sum may read it)"}},
		{"target_row with a key", "counters:\n" + counter("a", map[string]string{"target_row": "1"}),
			[]string{"walcount.yaml: counters[0] (a).key: a counter with target_row has no key"}},
		{"where mapping", "counters:\n" + counter("a", map[string]string{"where": "\n      state: {a: 1}"}),
			[]string{"walcount.yaml:9: counters[0] (a).where.state: must be a value (equality), null (IS NULL), a list of values (IN), or {not: null} (IS NOT NULL), {not: value} (<>) or {not: [values]} (NOT IN)"}},
		{"where duplicate after folding", "counters:\n" + counter("a", map[string]string{"where": "{state: 1, State: 2}"}),
			[]string{`walcount.yaml: counters[0] (a).where.`}},
		{"counters not a list", "counters: 5\n",
			[]string{"walcount.yaml:1: cannot unmarshal !!int `5` into the counters list"}},
		{"flush interval zero", "flush_interval: 0s\n",
			[]string{"walcount.yaml: flush_interval: 0s is out of range: must be more than 0 and at most 1h0m0s"}},
		{"flush interval negative", "flush_interval: -1s\n",
			[]string{"walcount.yaml: flush_interval: -1s is out of range"}},
		{"flush interval too long", "flush_interval: 2h\n",
			[]string{"walcount.yaml: flush_interval: 2h0m0s is out of range"}},
		{"flush interval without unit", "flush_interval: 5\n",
			[]string{"walcount.yaml:1: cannot unmarshal !!int `5` into a duration (write it like 1s, 500ms or 1h)"}},
		{"flush interval not a duration", "\nflush_interval: soon\n",
			[]string{"walcount.yaml:2: cannot unmarshal !!str `soon` into a duration"}},
		{"heartbeat zero", "heartbeat_interval: 0s\n",
			[]string{"walcount.yaml: heartbeat_interval: 0s is out of range: must be more than 0"}},
		{"stream timeout too short", "stream_timeout: 100ms\n",
			[]string{"walcount.yaml: stream_timeout: 100ms is out of range: must be 0 (derived from wal_sender_timeout) or at least 1s"}},
		{"stream timeout negative", "stream_timeout: -1s\n",
			[]string{"walcount.yaml: stream_timeout: -1s is out of range"}},
		{"slot upper case", "slot: Walcount\n",
			[]string{`walcount.yaml: slot: "Walcount" is not a valid slot name`}},
		{"slot with dash", "slot: wal-count\n",
			[]string{`walcount.yaml: slot: "wal-count" is not a valid slot name`}},
		{"slot too long", "slot: " + strings.Repeat("s", 64) + "\n",
			[]string{`walcount.yaml: slot: "sss`}},
		{"publication empty", "publication: ''\n",
			[]string{`walcount.yaml: publication: "" is not a valid publication name`}},
		{"log level", "log_level: loud\n",
			[]string{`walcount.yaml: log_level: "loud" is not one of debug, info, warn, error`}},
		{"cpu scheduling", "cpu_scheduling: realtime\n",
			[]string{`walcount.yaml: cpu_scheduling: "realtime" is not one of batch, normal`}},
		{"http addr", "http_addr: localhost\n",
			[]string{`walcount.yaml: http_addr: "localhost" is not host:port`}},
		{"database url scheme", "database_url: mysql://u:secret@h/db\n",
			[]string{`walcount.yaml: database_url: scheme "mysql" is not postgres:// or postgresql://`}},
		{"redis url scheme", "redis_url: http://h:6379\n",
			[]string{`walcount.yaml: redis_url: scheme "http" is not redis://, rediss:// or unix://`}},
		{"poll interval", "slot_monitor:\n  poll_interval: 0s\n",
			[]string{"walcount.yaml: slot_monitor.poll_interval: 0s is out of range"}},
		{"batch size", "reconcile:\n  batch_size: 0\n",
			[]string{"walcount.yaml: reconcile.batch_size: 0 is out of range"}},
		{"reconcile interval", "reconcile:\n  interval: -1h\n",
			[]string{"walcount.yaml: reconcile.interval: -1h0m0s is out of range"}},
		{"negative rate limit", "reconcile:\n  max_keys_per_second: -1\n",
			[]string{"walcount.yaml: reconcile.max_keys_per_second: -1 is out of range: must be 0 (no limit) or more"}},
		{"unknown top-level field", "slots: x\n",
			[]string{`walcount.yaml:1: unknown field "slots" at the top level`}},
		{"unknown counter field", "counters:\n" + counter("a", nil) + "    targetkey: id\n",
			[]string{`walcount.yaml:8: unknown field "targetkey" in a counter`}},
		{"unknown nested field", "reconcile:\n  batch: 5\n",
			[]string{`walcount.yaml:2: unknown field "batch" in reconcile`}},
		{"duplicate key", "slot: a\nslot: b\n",
			[]string{`walcount.yaml:2: mapping key "slot" already defined at line 1`}},
		{"syntax error", "slot: [\n",
			[]string{"walcount.yaml:1: did not find expected node content"}},
		{"not a mapping", "- slot\n",
			[]string{"walcount.yaml:1: the file must be a mapping of settings"}},
		{"unset variable", "slot: a\ndatabase_url: ${WALCOUNT_TEST_SURELY_UNSET}\n",
			[]string{"walcount.yaml:2: ${WALCOUNT_TEST_SURELY_UNSET}: environment variable WALCOUNT_TEST_SURELY_UNSET is not set"}},
		{"several problems", "slot: A\nflush_interval: 0s\ncounters:\n" + counter("a", map[string]string{"key": "-", "column": "-"}),
			[]string{
				`walcount.yaml: slot: "A" is not a valid slot name`,
				"walcount.yaml: flush_interval: 0s is out of range",
				"walcount.yaml: counters[0] (a).key: required",
				"walcount.yaml: counters[0] (a).column: required",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "walcount.yaml")
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("Parse(%q) error = %v, want a *config.Error", tt.yaml, err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) || len(ce.Problems) != len(tt.want) {
				t.Fatalf("Parse(%q) error:\n%v\nwant %d problems:\n%s", tt.yaml, err, len(tt.want), strings.Join(tt.want, "\n"))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("problem %d = %q, want prefix %q", i, lines[i], w)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows a password: %v", err)
			}
		})
	}
}

func TestParseCounters(t *testing.T) {
	const file = `
counters:
  - name: post_likes
    source: Likes
    key: Post_ID
    target: '"MyPosts"'
    target_key: '"ID"'
    column: likes_count
    where: {deleted_at: null, spam: false, kind: 5, price: 1.50, state: "open", '"Mixed"': ~}
  - name: order_total
    source: Shop.Orders
    key: customer_id
    target: shop.customers
    target_key: id
    column: total
    sum: amount
`
	cfg, err := Parse([]byte(file), "walcount.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	str := func(s string) *string { return &s }
	want := []counter.Counter{
		{Name: "post_likes", Source: "public.likes", Key: "post_id", Target: `public."MyPosts"`, TargetKey: "ID", Column: "likes_count",
			Where: map[string]*string{"deleted_at": nil, "spam": str("false"), "kind": str("5"), "price": str("1.50"), "state": str("open"), "Mixed": nil}},
		{Name: "order_total", Source: "shop.orders", Key: "customer_id", Target: "shop.customers", TargetKey: "id", Column: "total", Sum: "amount"},
	}
	if len(cfg.Counters) != len(want) {
		t.Fatalf("got %d counters, want %d", len(cfg.Counters), len(want))
	}
	for i, w := range want {
		g := cfg.Counters[i]
		if g.Name != w.Name || g.Source != w.Source || g.Key != w.Key || g.Target != w.Target ||
			g.TargetKey != w.TargetKey || g.Column != w.Column || g.Sum != w.Sum || len(g.Where) != len(w.Where) {
			t.Errorf("counter %d = %+v, want %+v", i, g, w)
		}
		for k, wv := range w.Where {
			gv, ok := g.Where[k]
			switch {
			case !ok:
				t.Errorf("counter %d: where %q missing", i, k)
			case (gv == nil) != (wv == nil) || (gv != nil && *gv != *wv):
				t.Errorf("counter %d: where %q = %v, want %v", i, k, deref(gv), deref(wv))
			}
		}
	}
	if s, tb := cfg.Counters[0].TargetTable(); s != "public" || tb != "MyPosts" {
		t.Errorf("TargetTable() = %q, %q", s, tb)
	}

	// Validate is idempotent on its own canonical forms.
	before := cfg.Counters[0]
	if err := cfg.Validate(); err != nil {
		t.Fatalf("second Validate: %v", err)
	}
	if cfg.Counters[0].Source != before.Source || cfg.Counters[0].Target != before.Target {
		t.Errorf("second Validate changed tables: %+v", cfg.Counters[0])
	}
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return *s
}

func TestParseDefaults(t *testing.T) {
	tests := []struct{ name, yaml string }{
		{"empty file", ""},
		{"comment only", "# nothing here\n"},
		{"counters absent", "slot: other\n"},
		{"counters empty", "counters: []\n"},
		{"counters null", "counters:\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml), "walcount.yaml")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(cfg.Counters) != 1 || cfg.Counters[0].Name != counter.Default().Name ||
				cfg.Counters[0].Source != "public.likes" || cfg.Counters[0].Target != "public.posts" {
				t.Errorf("Counters = %+v, want the default counter", cfg.Counters)
			}
			if cfg.FlushInterval != DefaultFlushInterval || cfg.Reconcile.BatchSize != reconcile.DefaultBatchSize ||
				cfg.SlotSettings.PollInterval != slot.DefaultPollInterval {
				t.Errorf("defaults lost: %+v", cfg)
			}
		})
	}
}

func TestParseSettings(t *testing.T) {
	t.Setenv("WALCOUNT_TEST_PASSWORD", "p$ss")
	const file = `
database_url: "postgres://app:${WALCOUNT_TEST_PASSWORD}@db:5432/app"
redis_url: ${WALCOUNT_TEST_REDIS:-redis://cache:6379/1}
slot: walcount_2
publication: walcount_pub
flush_interval: 500ms
heartbeat_interval: 30s
stream_timeout: 45s
http_addr: ":9000"
log_level: debug
slot_monitor:
  poll_interval: 1s
  max_lag_bytes: 1024
reconcile:
  batch_size: 50
  interval: 0s
  max_keys_per_second: 20000
`
	cfg, err := Parse([]byte(file), "walcount.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	zero := time.Duration(0)
	want := Config{
		DatabaseURL: "postgres://app:p$ss@db:5432/app", RedisURL: "redis://cache:6379/1",
		Slot: "walcount_2", Publication: "walcount_pub", FlushInterval: 500 * time.Millisecond,
		HeartbeatInterval: 30 * time.Second, StreamTimeout: 45 * time.Second, HTTPAddr: ":9000", LogLevel: "debug",
		SlotSettings: SlotSettings{PollInterval: time.Second, MaxLagBytes: 1024},
		Reconcile:    ReconcileSettings{BatchSize: 50, Interval: &zero, MaxKeysPerSecond: 20000},
	}
	got := cfg
	got.Counters = nil
	if got.Reconcile.Interval == nil || *got.Reconcile.Interval != 0 {
		t.Errorf("Reconcile.Interval = %v, want 0", got.Reconcile.Interval)
	}
	got.Reconcile.Interval, want.Reconcile.Interval = nil, nil
	if got.DatabaseURL != want.DatabaseURL || got.RedisURL != want.RedisURL || got.Slot != want.Slot ||
		got.Publication != want.Publication || got.FlushInterval != want.FlushInterval ||
		got.HeartbeatInterval != want.HeartbeatInterval || got.HTTPAddr != want.HTTPAddr ||
		got.LogLevel != want.LogLevel || got.SlotSettings != want.SlotSettings || got.Reconcile != want.Reconcile {
		t.Errorf("Parse =\n%+v\nwant\n%+v", got, want)
	}
}

func TestExpand(t *testing.T) {
	env := func(name string) (string, bool) {
		v, ok := map[string]string{"HOST": "db", "EMPTY": "", "PASS": "a${b}"}[name]
		return v, ok
	}
	tests := []struct {
		name, in, want, err string
	}{
		{name: "plain", in: "host: ${HOST}", want: "host: db"},
		{name: "twice", in: "${HOST}:${HOST}", want: "db:db"},
		{name: "default unused", in: "${HOST:-x}", want: "db"},
		{name: "default for unset", in: "${NOPE:-x:y}", want: "x:y"},
		{name: "default for empty", in: "${EMPTY:-x}", want: "x"},
		{name: "empty default", in: "[${NOPE:-}]", want: "[]"},
		{name: "set but empty", in: "[${EMPTY}]", want: "[]"},
		{name: "value not re-expanded", in: "${PASS}", want: "a${b}"},
		{name: "escaped", in: "$${HOST}", want: "${HOST}"},
		{name: "lone dollar", in: "pa$$word $HOST $", want: "pa$$word $HOST $"},
		{name: "unset", in: "a: 1\nb: ${NOPE}", err: "line 2: ${NOPE}: environment variable NOPE is not set"},
		{name: "two unset", in: "${A1} ${A2}", err: "line 1: ${A1}: environment variable A1 is not set\nline 1: ${A2}: environment variable A2 is not set"},
		{name: "bad name", in: "${1X}", err: `line 1: ${1X}: "1X" is not a variable name`},
		{name: "unterminated", in: "x\n${HOST\n}", err: "line 2: unterminated ${"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Expand([]byte(tt.in), env)
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
					t.Fatalf("Expand(%q) error = %v, want %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("Expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestValidateDefault(t *testing.T) {
	cfg := Default()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
}
