package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// TestFreshReadsDirtyWhileBackfilling: a counter added to a table that
// has rows is read while its backfill (paced) has not reached the key:
// the column does not count the rows older than the slot yet, so the read
// says dirty instead of vouching for a wrong value; once the backfill is
// done the same read is exact and not dirty.
func TestFreshReadsDirtyWhileBackfilling(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{Index: true, Posts: 300})+
		`INSERT INTO likes (post_id) SELECT 1 + g % 300 FROM generate_series(1, 1500) g;`)
	path := c.writeConfig(`
reconcile: {batch_size: 10, max_keys_per_second: 20}
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	pool, err := pgxpool.New(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	read := func() (int, map[string]any) {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/v1/counters/post_likes/300")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("read: %d, body %q: %v", resp.StatusCode, raw, err)
		}
		return resp.StatusCode, body
	}
	// At 20 keys a second, the backfill cannot reach key 300 before 15 s
	// have passed, however fast the machine: well after the first read.
	var done bool
	if err := pool.QueryRow(context.Background(), `SELECT coalesce((SELECT last_key::bigint >= 300 OR status = 'done' FROM walcount.reconcile_runs ORDER BY id DESC LIMIT 1), false)`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if done {
		t.Fatal("the backfill reached key 300 before the first read: it ran faster than max_keys_per_second")
	}
	code, body := read()
	if code != http.StatusOK || body["dirty"] != true {
		t.Errorf("read during the backfill = %d %v, want 200 with dirty: true", code, body)
	}
	var last map[string]any
	if !wait.Until(2*time.Minute, 100*time.Millisecond, func() bool {
		code, last = read()
		return code == http.StatusOK && last["dirty"] == nil
	}) {
		t.Fatalf("read after the backfill still %v", last)
	}
	if fmt.Sprint(last["value"]) != "5" {
		t.Errorf("read after the backfill = %v, want value 5 (the likes of post 300)", last)
	}
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
