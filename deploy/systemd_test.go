package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/config"
)

// systemdAnalyze returns the path of systemd-analyze. A unit that no
// systemd has read is not checked, so a missing tool fails the test.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze not found in PATH: install the systemd package "+
			"(`apt-get install --no-install-recommends systemd`; make deps does it as root): %v", err)
	}
	return path
}

// unitSettings reads a unit file's Key=Value lines by section; a key that
// appears more than once keeps every value.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	section := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "", strings.HasPrefix(line, "#"), strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	return out
}

// TestSystemdUnit checks deploy/systemd/walcount.service with systemd's
// own tools: `systemd-analyze verify` must accept it without a word
// (unknown keys, a key in the wrong section and bad values are all
// reported), and `systemd-analyze security --offline` must rate its
// sandbox at most 2.0 ("OK"). It also holds the unit to what the packages
// rely on: the walcount user, the environment file, restart on failure
// but not on a configuration error (exit 2), and a read-only system.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	sa := systemdAnalyze(t)
	const unit = "systemd/walcount.service"
	s := unitSettings(t, unit)
	want := map[string]string{
		"Service.User":                     "walcount",
		"Service.Group":                    "walcount",
		"Service.EnvironmentFile":          "/etc/walcount/walcount.env",
		"Service.ExecStart":                "/usr/bin/walcount run",
		"Service.Restart":                  "on-failure",
		"Service.RestartPreventExitStatus": "2",
		"Service.ProtectSystem":            "strict",
		"Service.ProtectHome":              "yes",
		"Service.NoNewPrivileges":          "yes",
		"Service.PrivateTmp":               "yes",
		"Service.KillSignal":               "SIGTERM",
		"Install.WantedBy":                 "multi-user.target",
	}
	for k, v := range want {
		if got := s[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s: %s=%q, want %q", unit, k, got, v)
		}
	}

	// verify checks that ExecStart's binary exists: point it at a stand-in,
	// the rest of the unit unchanged.
	dir := t.TempDir()
	bin := filepath.Join(dir, "walcount")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(b), "ExecStart=/usr/bin/walcount ", "ExecStart="+bin+" ", 1)
	if text == string(b) {
		t.Fatal("the unit has no ExecStart=/usr/bin/walcount line to point at a stand-in")
	}
	copyPath := filepath.Join(dir, "walcount.service")
	if err := os.WriteFile(copyPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", "--man=no", copyPath).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
	}

	// The environment file names only variables walcount reads.
	env, err := os.ReadFile("systemd/walcount.env")
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`(?m)^#?(WALCOUNT_[A-Z_]+)=`).FindAllStringSubmatch(string(env), -1)
	if len(named) < 3 {
		t.Errorf("systemd/walcount.env names %d variables, want the URLs and the config file at least", len(named))
	}
	for _, m := range named {
		known := false
		for _, st := range config.Settings {
			known = known || st.Env == m[1]
		}
		if !known {
			t.Errorf("systemd/walcount.env names %s, which walcount does not read", m[1])
		}
	}

	out, err = exec.Command(sa, "security", "--offline=yes", "--no-pager", copyPath).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for walcount\.service: ([0-9.]+)`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("systemd-analyze security --offline=yes %s: %v\n%s", unit, err, out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 2.0 {
		t.Errorf("systemd-analyze security rates the unit's exposure %.1f, want at most 2.0:\n%s", level, out)
	}
}
