package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/preflight"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestCheckJSON runs walcount check --json with the real binary: the
// findings are those of the text output, in its order, with their fixes
// and causes, and the exit code is the text output's; a check that cannot
// connect prints the error as JSON.
func TestCheckJSON(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema)
	args := []string{"check", "--database-url", c.db, "--redis-url", c.redis, "--slot", c.slot}
	decode := func(out string) checkReport {
		t.Helper()
		var r checkReport
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("check --json is not one JSON report: %v\n%s", err, out)
		}
		return r
	}
	// Before setup: problems that setup fixes.
	textCode, text, _ := walcount(t, nil, args...)
	code, out, _ := walcount(t, nil, append(args, "--json")...)
	r := decode(out)
	if code != textCode || code != exitFailure || r.ExitCode != code {
		t.Errorf("check --json: exit %d (exit_code %d), text exit %d, want %d", code, r.ExitCode, textCode, exitFailure)
	}
	// One line per finding; a fix of several lines goes on in lines
	// indented by preflight.FixIndent.
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if rest, ok := strings.CutPrefix(l, preflight.FixIndent); ok && len(lines) > 0 {
			lines[len(lines)-1] += "\n" + rest
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) != len(r.Findings) {
		t.Fatalf("%d findings in JSON, %d lines of text", len(r.Findings), len(lines))
	}
	problems := 0
	// The two runs see the shared server at different moments: other
	// tests' slots and WAL senders come and go, so numbers may differ.
	digits := regexp.MustCompile(`[0-9]+`)
	same := func(s string) string { return digits.ReplaceAllString(s, "#") }
	for i, f := range r.Findings {
		if !strings.Contains(same(lines[i]), same(f.Message)) || f.Fix != "" && !strings.HasSuffix(same(lines[i]), same(" — fix: "+f.Fix)) {
			t.Errorf("finding %d %+v does not match the text line %q", i, f, lines[i])
		}
		if f.Severity == "problem" {
			problems++
			if f.Check == "slot" && f.Cause != "setup" {
				t.Errorf("the missing slot's cause is %q, want setup", f.Cause)
			}
		}
	}
	if problems == 0 || problems != r.Problems {
		t.Errorf("%d problems listed, %d counted; want some before setup", problems, r.Problems)
	}

	// A problem only the configuration fixes: exit 2, cause config.
	path := c.writeConfig("counters:\n  - {name: a, source: likes, key: post_idd, target: posts, target_key: id, column: likes_count}\n")
	code, out, _ = walcount(t, nil, append(args, "--json", "--config", path)...)
	r = decode(out)
	found := false
	for _, f := range r.Findings {
		if f.Check == "column" && f.Severity == "problem" && f.Cause == "config" && strings.Contains(f.Fix, "counters[0].key") {
			found = true
		}
	}
	if code != exitUsage || r.ExitCode != exitUsage || !found {
		t.Errorf("check --json with a misspelt column: exit %d (exit_code %d), want %d with a config problem on counters[0].key", code, r.ExitCode, exitUsage)
	}

	// No PostgreSQL: the error, as JSON.
	code, out, _ = walcount(t, nil, "check", "--json", "--database-url", "postgres://u@"+unusedAddr(t)+"/app", "--redis-url", c.redis)
	r = decode(out)
	if code != exitFailure || r.ExitCode != exitFailure || !strings.Contains(r.Error, "cannot connect to PostgreSQL") {
		t.Errorf("check --json without PostgreSQL: exit %d, report %+v", code, r)
	}
}
