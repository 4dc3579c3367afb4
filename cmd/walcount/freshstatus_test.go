package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestStatusShowsFreshReads reads a key with min_lsn, a key with no row,
// and a key with a min_lsn walcount never reaches (a 504), then runs
// walcount status: its report shows the daemon's fresh reads by result,
// the waits and the time-out, and its JSON carries them in the daemon's
// view.
func TestStatusShowsFreshReads(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), goodSchema+`
INSERT INTO posts (id) VALUES (1);`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	d := startWalcount(t, env, "run")
	waitStreaming(t, d, addr)
	if _, out, _ := walcount(t, env, "status"); !strings.HasSuffix(freshReadsOf(out), " none since the daemon started") {
		t.Errorf("status before any read does not say there was none:\n%s", out)
	}

	ctx := context.Background()
	var lsn string
	if _, err := c.conn.Exec(ctx, "INSERT INTO likes (post_id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := c.conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		path string
		code int
	}{
		{"/v1/counters/post_likes/1?min_lsn=" + lsn, http.StatusOK},
		{"/v1/counters/post_likes/2", http.StatusNotFound},
		{"/v1/counters/post_likes/1?min_lsn=FFFFFFFF/0&timeout=200ms", http.StatusGatewayTimeout},
	} {
		code, a, err := freshGet(ctx, addr, r.path, "")
		if err != nil || code != r.code {
			t.Fatalf("%s: status %d (%v) %s, want %d", r.path, code, err, a.Error, r.code)
		}
	}

	code, out, _ := walcount(t, env, "status")
	if code != exitOK {
		t.Errorf("status: exit %d", code)
	}
	// The first read may or may not have had to wait for its min_lsn: the
	// stream may have read through it already.
	line := freshReadsOf(out)
	for _, want := range []string{"3 since the daemon started (1 ok, 1 not found, 1 timeout)", "waited for their min_lsn, 1 timed out (504)"} {
		if !strings.Contains(line, want) {
			t.Errorf("status's fresh reads line %q does not say %q", line, want)
		}
	}
	_, out, _ = walcount(t, env, "status", "--json")
	var r struct {
		Daemon struct {
			FreshReads struct {
				Reads, Waits, Timeouts int64
				Results                map[string]int64
			} `json:"fresh_reads"`
		} `json:"daemon"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	f := r.Daemon.FreshReads
	if f.Reads != 3 || f.Timeouts != 1 || f.Waits < 1 || f.Results["ok"] != 1 || f.Results["not_found"] != 1 {
		t.Errorf("status --json: daemon.fresh_reads %+v, want 3 reads (1 ok, 1 not_found, 1 timeout) and at least the 504's wait", f)
	}
	if code := d.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}

// freshReadsOf returns the fresh reads line of status's report.
func freshReadsOf(report string) string {
	for l := range strings.SplitSeq(report, "\n") {
		if strings.HasPrefix(l, "fresh reads ") {
			return l
		}
	}
	return ""
}
