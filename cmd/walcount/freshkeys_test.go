package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestFreshReadsManyKeysAndErrors: a read of many keys answers each at the
// one LSN of the answer (each equal to COUNT(*), a key with no row null);
// the bearer token guards /v1/counters/ (401 without it); a key with no
// row and nothing pending and an unknown counter are 404s; a filtered
// count and a total with no key are answered; a max counter is refused
// with a 422.
func TestFreshReadsManyKeysAndErrors(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{
		PostsColumns: "even_likes bigint NOT NULL DEFAULT 0, last_like bigint",
		LikesColumns: "n bigint NOT NULL DEFAULT 0, even boolean NOT NULL DEFAULT false", Index: true, Posts: 6})+`
ALTER TABLE likes ADD FOREIGN KEY (post_id) REFERENCES posts;
CREATE TABLE site (id int PRIMARY KEY, likes bigint NOT NULL DEFAULT 0);
INSERT INTO site VALUES (1, 0);`)
	path := c.writeConfig(`
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_even, source: likes, key: post_id, target: posts, target_key: id, column: even_likes, where: {even: "true"}}
  - {name: site_likes, source: likes, target: site, target_key: id, column: likes, target_row: "1"}
  - {name: post_last, source: likes, key: post_id, target: posts, target_key: id, column: last_like, max: n}
`)
	const token = "fresh-reads-token"
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path, "WALCOUNT_HTTP_TOKEN=" + token}
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
	// Post k gets k-1 likes (post 1 none), in one transaction each.
	for k := 2; k <= 6; k++ {
		if _, err := pool.Exec(context.Background(), "INSERT INTO likes (post_id, n, even) SELECT $1, g, g % 2 = 0 FROM generate_series(1, $1 - 1) g", k); err != nil {
			t.Fatal(err)
		}
	}
	var lsn string
	if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	get := func(path, tok string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("GET %s: %d, body %q: %v", path, resp.StatusCode, raw, err)
		}
		return resp.StatusCode, body
	}

	many := "/v1/counters/post_likes?keys=1,2,3,4,5,6,3,999&timeout=10s&min_lsn=" + lsn
	for _, tok := range []string{"", "wrong"} {
		if code, body := get(many, tok); code != http.StatusUnauthorized {
			t.Errorf("GET %s with token %q = %d %v, want 401", many, tok, code, body)
		}
		if code, body := get("/v1/counters/post_likes/2", tok); code != http.StatusUnauthorized {
			t.Errorf("GET one key with token %q = %d %v, want 401", tok, code, body)
		}
	}
	code, body := get(many, token)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %v", many, code, body)
	}
	if got, _ := body["lsn"].(string); lsnOf(got) < lsnOf(lsn) {
		t.Errorf("answered at lsn %q, below min_lsn %s", got, lsn)
	}
	values, _ := body["values"].(map[string]any)
	want := map[string]any{"1": 0.0, "2": 1.0, "3": 2.0, "4": 3.0, "5": 4.0, "6": 5.0, "999": nil}
	if fmt.Sprint(values) != fmt.Sprint(want) {
		t.Errorf("values %v, want %v (body %v)", values, want, body)
	}

	// A filtered count and a total with no key are answered too.
	code, body = get("/v1/counters/post_even?keys=5,6&min_lsn="+lsn, token)
	if v := fmt.Sprint(body["values"]); code != http.StatusOK || v != "map[5:2 6:2]" {
		t.Errorf("filtered count: %d %v, want values 5:2 6:2", code, body)
	}
	code, body = get("/v1/counters/site_likes/1?min_lsn="+lsn, token)
	if code != http.StatusOK || body["value"] != 15.0 {
		t.Errorf("total with no key: %d %v, want value 15", code, body)
	}

	for _, path := range []string{"/v1/counters/post_likes/999", "/v1/counters/nope/1"} {
		if code, body := get(path, token); code != http.StatusNotFound {
			t.Errorf("GET %s = %d %v, want 404", path, code, body)
		}
	}
	code, body = get("/v1/counters/post_last/3", token)
	if msg, _ := body["error"].(string); code != http.StatusUnprocessableEntity || !strings.Contains(msg, "max counters are not exact yet") {
		t.Errorf("GET of a max counter = %d %v, want 422", code, body)
	}
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
