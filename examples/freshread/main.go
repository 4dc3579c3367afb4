// Command freshread shows read-your-writes with walcount's fresh reads
// (docs/fresh-reads.md): it likes a post, takes the WAL position after the
// commit and asks walcount for the post's count with min_lsn, so the count
// it prints includes the like it just made.
//
// It runs against the example tables of deploy/compose/init.sql and the
// default counter post_likes:
//
//	DATABASE_URL=postgres://… WALCOUNT_URL=http://127.0.0.1:9750 go run ./examples/freshread -post 42
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// freshValue is the part of walcount's answer this example reads.
type freshValue struct {
	Value json.Number `json:"value"` // as written: a count stays exact past 2^53
	LSN   string      `json:"lsn"`
	Error string      `json:"error"`
}

func main() {
	post := flag.Int64("post", 42, "the post to like")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, *post); err != nil {
		fmt.Fprintln(os.Stderr, "freshread:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, post int64) error {
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)

	// The write commits; then, on the same connection, the WAL position
	// after it. Any read through walcount at or past that LSN sees it.
	if _, err := conn.Exec(ctx, "INSERT INTO likes (post_id, user_id) VALUES ($1, 7)", post); err != nil {
		return err
	}
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}

	v, err := readCounter(ctx, "post_likes", post, lsn)
	if err != nil {
		return err
	}
	fmt.Printf("post %d has %s likes (exact at %s, written at %s)\n", post, v.Value, v.LSN, lsn)
	return nil
}

// readCounter asks walcount for counter's value of key once it has read
// the WAL through minLSN, waiting at most 2 s for it.
func readCounter(ctx context.Context, counter string, key int64, minLSN string) (freshValue, error) {
	base := os.Getenv("WALCOUNT_URL")
	if base == "" {
		base = "http://127.0.0.1:9750"
	}
	q := url.Values{"min_lsn": {minLSN}, "timeout": {"2s"}}
	u := fmt.Sprintf("%s/v1/counters/%s/%d?%s", base, url.PathEscape(counter), key, q.Encode())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return freshValue{}, err
	}
	if token := os.Getenv("WALCOUNT_HTTP_TOKEN"); token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return freshValue{}, err
	}
	defer resp.Body.Close()
	var v freshValue
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("%s: %s", u, resp.Status)
	}
	// 504: walcount did not read through minLSN within the timeout; 404:
	// no such post. Each says why in "error".
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("%s: %s: %s", u, resp.Status, v.Error)
	}
	return v, nil
}
