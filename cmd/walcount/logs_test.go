package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// duplicateKeys returns the keys that occur more than once in one object
// of the JSON text, at any depth, or an error when it is not one JSON
// value. encoding/json keeps the last of two equal keys without a word, so
// the tokens are walked instead.
func duplicateKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var dups []string
	var value func(path string) error
	value = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k := kt.(string)
				if seen[k] {
					dups = append(dups, path+k)
				}
				seen[k] = true
				if err := value(path + k + "."); err != nil {
					return err
				}
			}
			_, err = dec.Token() // }
			return err
		case json.Delim('['):
			for dec.More() {
				if err := value(path + "[]."); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ]
			return err
		}
		return nil
	}
	if err := value(""); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("more than one JSON value on the line")
	}
	return dups, nil
}

func TestDuplicateKeys(t *testing.T) {
	for line, want := range map[string]string{
		`{"slot":"walcount","msg":"x"}`:                    "",
		`{"slot":"walcount","slot":"walcount"}`:            "slot",
		`{"a":{"b":1,"b":2},"c":[{"d":1,"d":1}]}`:          "a.b c.[].d",
		`{"a":{"b":1},"b":{"a":1}}`:                        "",
		`{"level":"info","msg":"m","level":"error","x":1}`: "level",
	} {
		dups, err := duplicateKeys([]byte(line))
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if got := strings.Join(dups, " "); got != want {
			t.Errorf("duplicateKeys(%s) = %q, want %q", line, got, want)
		}
	}
	if _, err := duplicateKeys([]byte(`{"a":1} {"b":2}`)); err == nil {
		t.Error("two values on one line were accepted")
	}
}

// TestRunLogsAreCleanJSON runs the real binary with its stderr in a pipe
// (so the default format is JSON) at debug level, under traffic, through
// a Redis outage (error lines) and a stop: every line is one JSON object
// with no key twice and no stack trace; an API listening on every
// interface without a token is warned about.
func TestRunLogsAreCleanJSON(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	c := newCLI(t, testenv.Database(t), goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 10) g;")
	c.redis = rd.URL()
	addr := unusedAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	run := startWalcount(t, env, "run", "--log-level", "debug", "--flush-interval", "100ms", "--http-addr", "0.0.0.0:"+port)
	waitStreaming(t, run, addr)

	if _, err := c.conn.Exec(context.Background(), `INSERT INTO likes (post_id) SELECT 1 + g % 10 FROM generate_series(1, 200) g`); err != nil {
		t.Fatal(err)
	}
	poll(t, "the likes to be counted", func() (bool, string) {
		n := c.count(`SELECT coalesce(sum(likes_count), 0) FROM posts`)
		return n == 200, fmt.Sprintf("%d counted", n)
	})
	if err := rd.Kill(); err != nil {
		t.Fatal(err)
	}
	poll(t, "a failed session to be logged", func() (bool, string) {
		return strings.Contains(run.stderr.String(), "session failed"), "no such line yet"
	})
	if err := rd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	poll(t, "the daemon to recover", func() (bool, string) {
		return strings.Contains(run.stderr.String(), "recovered: streaming again"), "no such line yet"
	})
	if code := run.stop(); code != exitOK {
		t.Fatalf("run after SIGTERM: exit %d", code)
	}

	levels := map[string]int{}
	var warnedOpen, sawInterval, sawTook bool
	for i, line := range strings.Split(strings.TrimSpace(run.stderr.String()), "\n") {
		dups, err := duplicateKeys([]byte(line))
		if err != nil {
			t.Errorf("stderr line %d is not one JSON object (%v): %s", i+1, err, line)
			continue
		}
		if len(dups) > 0 {
			t.Errorf("stderr line %d carries %q twice: %s", i+1, dups, line)
		}
		var fields map[string]any
		if err := json.Unmarshal([]byte(line), &fields); err != nil {
			t.Errorf("stderr line %d: %v", i+1, err)
			continue
		}
		if _, ok := fields["stacktrace"]; ok {
			t.Errorf("stderr line %d carries a stack trace: %s", i+1, line)
		}
		lvl, _ := fields["level"].(string)
		levels[lvl]++
		// A duration carries its unit in its key: seconds, as a number.
		for k, v := range fields {
			if strings.HasSuffix(k, "_seconds") {
				if _, ok := v.(float64); !ok {
					t.Errorf("stderr line %d: %s = %v is not a number of seconds: %s", i+1, k, v, line)
				}
			}
			for _, bare := range []string{"took", "retry_in", "flush_interval", "blocked_for"} {
				if k == bare {
					t.Errorf("stderr line %d: duration %q without its unit in the key: %s", i+1, k, line)
				}
			}
		}
		if fi, ok := fields["flush_interval_seconds"]; ok {
			sawInterval = true
			if fi != 0.1 {
				t.Errorf("flush_interval_seconds = %v with --flush-interval 100ms, want 0.1", fi)
			}
		}
		if _, ok := fields["took_seconds"]; ok && fields["msg"] == "flushed" {
			sawTook = true
		}
		if msg, _ := fields["msg"].(string); lvl == "warn" && strings.Contains(msg, "listens beyond loopback without a token") {
			warnedOpen = true
		}
	}
	t.Logf("log lines by level: %v", levels)
	if levels["error"] == 0 || levels["debug"] == 0 {
		t.Errorf("want error and debug lines among those checked, got %v", levels)
	}
	if !warnedOpen {
		t.Error("no warning about the API listening on every interface without a token")
	}
	if !sawInterval || !sawTook {
		t.Errorf("no flush_interval_seconds (%v) or flushed line with took_seconds (%v)", sawInterval, sawTook)
	}
}

// TestLogFormatConsole runs walcount run with --log-format console and its
// stderr in a pipe: the lines are for people, not JSON.
func TestLogFormatConsole(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema)
	addr := unusedAddr(t)
	if code, _ := c.run("setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	run := startWalcount(t, []string{"WALCOUNT_LOG_FORMAT=console"},
		"run", "--database-url", c.db, "--redis-url", c.redis, "--slot", c.slot, "--http-addr", addr)
	waitStreaming(t, run, addr)
	if code := run.stop(); code != exitOK {
		t.Fatalf("run after SIGTERM: exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(run.stderr.String()), "\n")
	var streaming bool
	for _, line := range lines {
		if strings.HasPrefix(line, "{") {
			t.Errorf("a JSON line with --log-format console: %s", line)
		}
		if strings.Contains(line, "\tINFO\t") && strings.Contains(line, "\tstreaming") {
			streaming = true
		}
	}
	if !streaming {
		t.Errorf("no console INFO line saying streaming:\n%s", run.stderr.String())
	}
}

// TestRefusedRunSaysWhatToFix runs walcount run and check on databases
// that do not fit the configuration: run prints the problems once, as its
// error, with no log line per finding and no stack trace, and the messages
// point at the real cause.
func TestRefusedRunSaysWhatToFix(t *testing.T) {
	t.Parallel()
	t.Run("default counter in an empty database", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t, testenv.Database(t), "")
		var dbName string
		if err := c.conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&dbName); err != nil {
			t.Fatal(err)
		}
		env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot, "WALCOUNT_HTTP_ADDR="}
		code, stdout, stderr := walcount(t, env, "run")
		if code != exitUsage {
			t.Errorf("run: exit %d, want %d: only another database or a config file helps", code, exitUsage)
		}
		for _, want := range []string{
			"source table public.likes does not exist in database " + dbName,
			"no config file is in use", "needs tables public.likes and public.posts",
			"--database-url", "config file with counters",
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("run does not say %q", want)
			}
		}
		if strings.Contains(stderr, "counters[0]") {
			t.Error("run points into a config file that is not in use")
		}
		checkRefusalOutput(t, stdout, stderr)
		code, out, _ := walcount(t, env, "check")
		if code != exitUsage || !strings.Contains(out, "no config file is in use") {
			t.Errorf("check: exit %d, want %d and the same advice", code, exitUsage)
		}
	})
	t.Run("misspelt column", func(t *testing.T) {
		t.Parallel()
		c := newCLI(t, testenv.Database(t), goodSchema)
		path := c.writeConfig("counters:\n  - {name: a, source: likes, key: post_idd, target: posts, target_key: id, column: likes_count}\n")
		env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot, "WALCOUNT_HTTP_ADDR=", "WALCOUNT_CONFIG=" + path}
		if code, _, _ := walcount(t, env, "setup"); code != exitUsage {
			t.Errorf("setup with a misspelt column: exit %d, want %d", code, exitUsage)
		}
		code, stdout, stderr := walcount(t, env, "run")
		if code != exitUsage || !strings.Contains(stderr, "column public.likes.post_idd does not exist (did you mean post_id?)") ||
			!strings.Contains(stderr, "set counters[0].key in "+path) {
			t.Errorf("run: exit %d, want %d with the closest column and the file to fix", code, exitUsage)
		}
		checkRefusalOutput(t, stdout, stderr)
	})
}

// checkRefusalOutput fails unless a refused run printed its refusal once,
// as plain text, with no stack trace and no error log line per finding.
func checkRefusalOutput(t *testing.T, stdout, stderr string) {
	t.Helper()
	if n := strings.Count(stderr, "walcount: preflight found"); n != 1 {
		t.Errorf("the refusal is printed %d times, want once", n)
	}
	for _, line := range strings.Split(stdout+stderr, "\n") {
		if strings.Contains(line, "stacktrace") || strings.Contains(line, ".go:") && strings.Contains(line, "\tgithub.com/") {
			t.Errorf("a stack trace in a refused run's output: %s", line)
		}
		if strings.HasPrefix(line, "{") && strings.Contains(line, `"level":"error"`) {
			t.Errorf("a finding logged as an error line: %s", line)
		}
	}
}
