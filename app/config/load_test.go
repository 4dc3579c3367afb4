package config

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func mapEnv(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func writeFile(tb testing.TB, content string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "walcount.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatalf("write config file: %v", err)
	}
	return path
}

func TestLoadPrecedence(t *testing.T) {
	const (
		flagDB  = "postgres://flag/db"
		fileDB  = "postgres://file/db"
		envDB   = "postgres://walcount-env/db"
		plainDB = "postgres://plain-env/db"
	)
	tests := []struct {
		name   string
		file   string // config file content; "" = no file
		env    map[string]string
		ov     Overrides
		wantDB string
	}{
		{name: "default", wantDB: DefaultDatabaseURL},
		{name: "DATABASE_URL over default", env: map[string]string{"DATABASE_URL": plainDB}, wantDB: plainDB},
		{name: "WALCOUNT_DATABASE_URL over DATABASE_URL",
			env: map[string]string{"DATABASE_URL": plainDB, "WALCOUNT_DATABASE_URL": envDB}, wantDB: envDB},
		{name: "empty variable counts as unset",
			env: map[string]string{"DATABASE_URL": plainDB, "WALCOUNT_DATABASE_URL": ""}, wantDB: plainDB},
		{name: "WALCOUNT_DATABASE_URL over file", file: "database_url: " + fileDB + "\n",
			env: map[string]string{"DATABASE_URL": plainDB, "WALCOUNT_DATABASE_URL": envDB}, wantDB: envDB},
		{name: "file over DATABASE_URL", file: "database_url: " + fileDB + "\n",
			env: map[string]string{"DATABASE_URL": plainDB}, wantDB: fileDB},
		{name: "file without the key keeps environment", file: "slot: s\n",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, wantDB: envDB},
		{name: "file without the key keeps DATABASE_URL", file: "slot: s\n",
			env: map[string]string{"DATABASE_URL": plainDB}, wantDB: plainDB},
		{name: "file setting the default value still overrides DATABASE_URL",
			file: "database_url: " + DefaultDatabaseURL + "\n",
			env:  map[string]string{"DATABASE_URL": plainDB}, wantDB: DefaultDatabaseURL},
		{name: "flag over file", file: "database_url: " + fileDB + "\n",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, ov: Overrides{"database-url": flagDB}, wantDB: flagDB},
		{name: "flag over environment",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, ov: Overrides{"database-url": flagDB}, wantDB: flagDB},
		{name: "file expands the environment", file: "database_url: ${APP_DB}x\n",
			env: map[string]string{"APP_DB": envDB}, wantDB: envDB + "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := ""
			if tt.file != "" {
				path = writeFile(t, tt.file)
			}
			cfg, err := Load(path, mapEnv(tt.env), tt.ov)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if cfg.DatabaseURL != tt.wantDB {
				t.Errorf("DatabaseURL = %q, want %q", cfg.DatabaseURL, tt.wantDB)
			}
		})
	}
}

func TestLoadRedisAndFlags(t *testing.T) {
	path := writeFile(t, `
redis_url: redis://file:6379/0
slot: file_slot
publication: file_pub
http_addr: 127.0.0.1:1
log_level: warn
flush_interval: 2s
cpu_scheduling: normal
`)
	env := mapEnv(map[string]string{"WALCOUNT_REDIS_URL": "redis://env:6379/0", "REDIS_URL": "redis://plain:6379/0"})

	cfg, err := Load(path, mapEnv(map[string]string{"REDIS_URL": "redis://plain:6379/0"}), Overrides{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.RedisURL != "redis://file:6379/0" || cfg.Slot != "file_slot" || cfg.Publication != "file_pub" ||
		cfg.HTTPAddr != "127.0.0.1:1" || cfg.LogLevel != "warn" || cfg.FlushInterval != 2*time.Second ||
		cfg.CPUScheduling != CPUSchedulingNormal {
		t.Errorf("file values not applied: %+v", cfg)
	}

	cfg, err = Load(path, env, Overrides{
		"redis-url": "redis://flag:6379/0", "slot": "flag_slot", "publication": "flag_pub",
		"http-addr": "", "log-level": "debug", "flush-interval": "250ms",
		"cpu-scheduling": CPUSchedulingBatch,
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.RedisURL != "redis://flag:6379/0" || cfg.Slot != "flag_slot" || cfg.Publication != "flag_pub" ||
		cfg.HTTPAddr != "" || cfg.LogLevel != "debug" || cfg.FlushInterval != 250*time.Millisecond ||
		cfg.CPUScheduling != CPUSchedulingBatch {
		t.Errorf("flags not applied: %+v", cfg)
	}

	cfg, err = Load("", env, Overrides{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.RedisURL != "redis://env:6379/0" || cfg.Slot != DefaultSlot {
		t.Errorf("environment/defaults not applied: %+v", cfg)
	}
}

func TestLoadConfigPath(t *testing.T) {
	flagFile := writeFile(t, "slot: from_flag\n")
	envFile := writeFile(t, "slot: from_env\n")
	tests := []struct {
		name, path string
		env        map[string]string
		wantSlot   string
	}{
		{"no file", "", nil, DefaultSlot},
		{"WALCOUNT_CONFIG", "", map[string]string{"WALCOUNT_CONFIG": envFile}, "from_env"},
		{"--config over WALCOUNT_CONFIG", flagFile, map[string]string{"WALCOUNT_CONFIG": envFile}, "from_flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(tt.path, mapEnv(tt.env), Overrides{})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if cfg.Slot != tt.wantSlot {
				t.Errorf("Slot = %q, want %q", cfg.Slot, tt.wantSlot)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	file := writeFile(t, "slot: Bad\n")
	good := writeFile(t, "slot: good\n")
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	tests := []struct {
		name string
		path string
		env  map[string]string
		ov   Overrides
		want string
	}{
		{name: "missing file", path: missing, want: missing + ": read config file: no such file or directory"},
		{name: "missing file from WALCOUNT_CONFIG", env: map[string]string{"WALCOUNT_CONFIG": missing},
			want: missing + ": read config file: no such file or directory"},
		{name: "bad value in file", path: file, want: file + `: slot: "Bad" is not a valid slot name`},
		{name: "bad flag", path: good, ov: Overrides{"slot": "Bad"}, want: `--slot: "Bad" is not a valid slot name`},
		{name: "flag fixes the file", path: file, ov: Overrides{"slot": "fixed", "flush-interval": "0s"},
			want: "--flush-interval: 0s is out of range"},
		{name: "bad variable", env: map[string]string{"WALCOUNT_REDIS_URL": "http://u:secret@h"},
			want: `WALCOUNT_REDIS_URL: scheme "http" is not redis://`},
		{name: "bad fallback variable", env: map[string]string{"DATABASE_URL": "mysql://u:secret@h"},
			want: `DATABASE_URL: scheme "mysql" is not postgres://`},
		{name: "unset variable in file", path: writeFile(t, "redis_url: ${NOPE}\n"),
			want: ": ${NOPE}: environment variable NOPE is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.path, mapEnv(tt.env), tt.ov)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("Load error = %v, want a *config.Error", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load error = %q, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows a password: %v", err)
			}
		})
	}
}

// TestLoadEverySettingPrecedence checks, for every setting a flag sets,
// that its environment variable overrides the file and that the flag
// overrides the variable: flag > environment > file > default.
func TestLoadEverySettingPrecedence(t *testing.T) {
	type values struct {
		file, env string
		flag      Overrides
		get       func(Config) string
		wantFlag  string
	}
	cases := map[string]values{
		"database_url": {"postgres://file/db", "postgres://env/db", Overrides{"database-url": "postgres://flag/db"},
			func(c Config) string { return c.DatabaseURL }, "postgres://flag/db"},
		"replication_url": {"postgres://file/repl", "postgres://env/repl", Overrides{"replication-url": "postgres://flag/repl"},
			func(c Config) string { return c.ReplicationURL }, "postgres://flag/repl"},
		"redis_url": {"redis://file:6379/0", "redis://env:6379/0", Overrides{"redis-url": "redis://flag:6379/0"},
			func(c Config) string { return c.RedisURL }, "redis://flag:6379/0"},
		"slot":        {"file_slot", "env_slot", Overrides{"slot": "flag_slot"}, func(c Config) string { return c.Slot }, "flag_slot"},
		"publication": {"file_pub", "env_pub", Overrides{"publication": "flag_pub"}, func(c Config) string { return c.Publication }, "flag_pub"},
		"flush_interval": {"2s", "3s", Overrides{"flush-interval": "4s"},
			func(c Config) string { return c.FlushInterval.String() }, "4s"},
		"http_addr":  {"127.0.0.1:1", "127.0.0.1:2", Overrides{"http-addr": "127.0.0.1:3"}, func(c Config) string { return c.HTTPAddr }, "127.0.0.1:3"},
		"http_token": {"file-token", "env-token", Overrides{"http-token": "flag-token"}, func(c Config) string { return c.HTTPToken }, "flag-token"},
		"log_level":  {"warn", "error", Overrides{"log-level": "debug"}, func(c Config) string { return c.LogLevel }, "debug"},
		"log_format": {"console", "json", Overrides{"log-format": "auto"}, func(c Config) string { return c.LogFormat }, "auto"},
		"cpu_scheduling": {"normal", "batch", Overrides{"cpu-scheduling": "normal"},
			func(c Config) string { return c.CPUScheduling }, "normal"},
		"on_slot_loss": {"recreate", "stop", Overrides{"on-slot-loss": "recreate"},
			func(c Config) string { return c.OnSlotLoss }, "recreate"},
		"reconcile.max_keys_per_second": {"5000", "7000", Overrides{"max-keys-per-second": "9000"},
			func(c Config) string { return strconv.Itoa(c.Reconcile.MaxKeysPerSecond) }, "9000"},
	}
	for _, s := range Settings {
		if s.Key == "" {
			continue // --config is tested by TestLoadConfigPath
		}
		t.Run(s.Key, func(t *testing.T) {
			v, ok := cases[s.Key]
			if !ok {
				t.Fatalf("no test values for setting %s: add them here", s.Key)
			}
			if want := "WALCOUNT_" + strings.ToUpper(strings.ReplaceAll(s.Flag, "-", "_")); s.Env != want {
				t.Errorf("--%s reads %s, want %s", s.Flag, s.Env, want)
			}
			path := writeFile(t, yamlSetting(s.Key, v.file))
			env := mapEnv(map[string]string{s.Env: v.env})
			if cfg, err := Load(path, nil, Overrides{}); err != nil || v.get(cfg) != v.file {
				t.Errorf("file alone: %s = %q, %v; want %q", s.Key, v.get(cfg), err, v.file)
			}
			if cfg, err := Load(path, env, Overrides{}); err != nil || v.get(cfg) != v.env {
				t.Errorf("file and %s: %s = %q, %v; want the variable's %q", s.Env, s.Key, v.get(cfg), err, v.env)
			}
			if cfg, err := Load(path, env, v.flag); err != nil || v.get(cfg) != v.wantFlag {
				t.Errorf("file, %s and --%s: %s = %q, %v; want the flag's %q", s.Env, s.Flag, s.Key, v.get(cfg), err, v.wantFlag)
			}
		})
	}
}

// yamlSetting writes key: value, nested for a dotted key
// (reconcile.max_keys_per_second).
func yamlSetting(key, value string) string {
	var b strings.Builder
	parts := strings.Split(key, ".")
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i < len(parts)-1 {
			b.WriteString("\n")
		}
	}
	return b.String() + " " + value + "\n"
}

func TestLoadEnvironmentErrors(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		ov   Overrides
		want string // "" means no error
	}{
		{name: "duration that does not parse", env: map[string]string{"WALCOUNT_FLUSH_INTERVAL": "often"},
			want: `WALCOUNT_FLUSH_INTERVAL: "often" is not a duration`},
		{name: "duration out of range", env: map[string]string{"WALCOUNT_FLUSH_INTERVAL": "0s"},
			want: "WALCOUNT_FLUSH_INTERVAL: 0s is out of range"},
		{name: "a flag makes a bad variable moot", env: map[string]string{"WALCOUNT_FLUSH_INTERVAL": "often"},
			ov: Overrides{"flush-interval": "1s"}},
		{name: "bad log format", env: map[string]string{"WALCOUNT_LOG_FORMAT": "xml"},
			want: `WALCOUNT_LOG_FORMAT: "xml" is not one of auto, console, json`},
		{name: "bad slot", env: map[string]string{"WALCOUNT_SLOT": "Bad"}, want: `WALCOUNT_SLOT: "Bad" is not a valid slot name`},
		{name: "token with a space", env: map[string]string{"WALCOUNT_HTTP_TOKEN": "secret token"},
			want: "WALCOUNT_HTTP_TOKEN: must be printable ASCII without spaces"},
		{name: "rate that does not parse", env: map[string]string{"WALCOUNT_MAX_KEYS_PER_SECOND": "fast"},
			want: `WALCOUNT_MAX_KEYS_PER_SECOND: "fast" is not a whole number`},
		{name: "negative rate", env: map[string]string{"WALCOUNT_MAX_KEYS_PER_SECOND": "-5"},
			want: "WALCOUNT_MAX_KEYS_PER_SECOND: -5 is out of range: must be 0 (no limit) or more"},
		{name: "a flag makes a bad rate moot", env: map[string]string{"WALCOUNT_MAX_KEYS_PER_SECOND": "fast"},
			ov: Overrides{"max-keys-per-second": "100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load("", mapEnv(tt.env), tt.ov)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load error = %v, want a *config.Error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

// TestSettingsDocumented checks that docs/configuration.md's table lists
// every setting a flag sets, with its flag, variable and file key.
func TestSettingsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for line := range strings.SplitSeq(string(doc), "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) > 2 {
			rows[strings.TrimSpace(cells[2])] = line
		}
	}
	for _, s := range Settings {
		row, ok := rows["`--"+s.Flag+"`"]
		if !ok {
			t.Errorf("docs/configuration.md has no table row whose flag column is `--%s`", s.Flag)
			continue
		}
		for _, want := range []string{"`" + s.Env + "`", "`" + s.Default + "`"} {
			if s.Default == "none" && want == "`none`" {
				want = "none"
			}
			if !strings.Contains(row, want) {
				t.Errorf("the row of --%s does not say %s: %s", s.Flag, want, row)
			}
		}
		if s.Key != "" && !strings.Contains(row, "`"+s.Key+"`") {
			t.Errorf("the row of --%s does not name the file key `%s`: %s", s.Flag, s.Key, row)
		}
	}
}
