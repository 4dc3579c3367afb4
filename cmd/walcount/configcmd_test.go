package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCommand runs walcount config with the real binary and settings
// from each place: every setting is printed with where it came from, and
// no secret is shown.
func TestConfigCommand(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "walcount.yaml")
	if err := os.WriteFile(path, []byte("flush_interval: 3s\nslot: fileslot\nslot_monitor:\n  max_lag_bytes: 2048\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"WALCOUNT_SLOT=envslot", "WALCOUNT_HTTP_TOKEN=secret-token", "REDIS_URL=redis://:redispw@cache:6379/1", "WALCOUNT_CONFIG=" + path}
	code, out, stderr := walcount(t, env, "config", "--database-url", "postgres://app:dbpw@db:5432/app")
	if code != exitOK {
		t.Fatalf("walcount config: exit %d\n%s", code, stderr)
	}
	lines := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			lines[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for key, want := range map[string]string{
		"database_url":               `"postgres://app:xxxxx@db:5432/app" flag --database-url`,
		"redis_url":                  `"redis://:xxxxx@cache:6379/1" environment variable REDIS_URL`,
		"slot":                       "envslot environment variable WALCOUNT_SLOT",
		"flush_interval":             "3s config file " + path,
		"slot_monitor.max_lag_bytes": "2048 config file " + path,
		"slot_monitor.poll_interval": "5s default",
		"http_token":                 "xxxxx (set) environment variable WALCOUNT_HTTP_TOKEN",
		"log_level":                  "info default",
		"counters":                   "1: post_likes default",
	} {
		if lines[key] != want {
			t.Errorf("%s: %q, want %q", key, lines[key], want)
		}
	}
	if !strings.Contains(out, "config file: "+path+" (from environment variable WALCOUNT_CONFIG)") {
		t.Errorf("walcount config does not say which file it read and why:\n%s", out)
	}
	for _, secret := range []string{"dbpw", "redispw", "secret-token"} {
		if strings.Contains(out+stderr, secret) {
			t.Errorf("walcount config shows the secret %q", secret)
		}
	}
}
