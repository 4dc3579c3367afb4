package config

import (
	"errors"
	"os"
	"path/filepath"
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
	str := func(s string) *string { return &s }
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
		{name: "file over environment", file: "database_url: " + fileDB + "\n",
			env: map[string]string{"DATABASE_URL": plainDB, "WALCOUNT_DATABASE_URL": envDB}, wantDB: fileDB},
		{name: "file without the key keeps environment", file: "slot: s\n",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, wantDB: envDB},
		{name: "file setting the default value still overrides environment",
			file: "database_url: " + DefaultDatabaseURL + "\n",
			env:  map[string]string{"WALCOUNT_DATABASE_URL": envDB}, wantDB: DefaultDatabaseURL},
		{name: "flag over file", file: "database_url: " + fileDB + "\n",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, ov: Overrides{DatabaseURL: str(flagDB)}, wantDB: flagDB},
		{name: "flag over environment",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, ov: Overrides{DatabaseURL: str(flagDB)}, wantDB: flagDB},
		{name: "file expands the environment", file: "database_url: ${WALCOUNT_DATABASE_URL}x\n",
			env: map[string]string{"WALCOUNT_DATABASE_URL": envDB}, wantDB: envDB + "x"},
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
	str := func(s string) *string { return &s }
	dur := func(d time.Duration) *time.Duration { return &d }
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

	cfg, err := Load(path, env, Overrides{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.RedisURL != "redis://file:6379/0" || cfg.Slot != "file_slot" || cfg.Publication != "file_pub" ||
		cfg.HTTPAddr != "127.0.0.1:1" || cfg.LogLevel != "warn" || cfg.FlushInterval != 2*time.Second ||
		cfg.CPUScheduling != CPUSchedulingNormal {
		t.Errorf("file values not applied: %+v", cfg)
	}

	cfg, err = Load(path, env, Overrides{
		RedisURL: str("redis://flag:6379/0"), Slot: str("flag_slot"), Publication: str("flag_pub"),
		HTTPAddr: str(""), LogLevel: str("debug"), FlushInterval: dur(250 * time.Millisecond),
		CPUScheduling: str(CPUSchedulingBatch),
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
	str := func(s string) *string { return &s }
	dur := func(d time.Duration) *time.Duration { return &d }
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
		{name: "bad flag", path: good, ov: Overrides{Slot: str("Bad")}, want: `--slot: "Bad" is not a valid slot name`},
		{name: "flag fixes the file", path: file, ov: Overrides{Slot: str("fixed"), FlushInterval: dur(0)},
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
