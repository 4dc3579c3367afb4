package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Section 10 (-only binary): what pgoutput's binary option saves the
// walsender. One backlog of single-row likes, read once as text and once
// in binary (send format) by the bare reader, each from a slot of its own
// made before the backlog; the walsender's CPU per change of each. The
// likes table is the bench's: bigint columns, REPLICA IDENTITY FULL.
func runBinaryBench(ctx context.Context, b *bench) (string, error) {
	c, err := newCluster(ctx, zipfPosts)
	if err != nil {
		return "", err
	}
	defer c.close()
	if _, err := c.db.Exec(ctx, `CREATE PUBLICATION bench_bin FOR TABLE likes`); err != nil {
		return "", err
	}
	variants := []struct {
		name, slot string
		args       []string
	}{
		{"text", "bin_text", nil},
		{"binary", "bin_binary", []string{"binary 'true'"}},
		{"text again", "bin_text2", nil},
		{"binary again", "bin_binary2", []string{"binary 'true'"}},
	}
	for _, v := range variants {
		if _, err := c.db.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, v.slot); err != nil {
			return "", err
		}
	}
	if _, err := c.db.Exec(ctx, backlogSQL); err != nil {
		return "", err
	}
	n := int(b.backlog)
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return "", err
	}
	_, err = conn.Exec(ctx, `SET synchronous_commit = off`)
	if err == nil {
		_, err = conn.Exec(ctx, `CALL bench_backlog($1, 1, $2)`, n, zipfPosts)
	}
	conn.Release()
	if err != nil {
		return "", fmt.Errorf("backlog: %w", err)
	}
	var end pglogrepl.LSN
	var endText string
	if err := c.db.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&endText); err != nil {
		return "", err
	}
	if end, err = pglogrepl.ParseLSN(endText); err != nil {
		return "", err
	}
	// A transaction past the backlog ends each drain.
	if _, err := c.db.Exec(ctx, `INSERT INTO likes (post_id, user_id) VALUES (1, 0)`); err != nil {
		return "", err
	}
	var out strings.Builder
	fmt.Fprintf(&out, "## 10. pgoutput text or binary\n\nPostgreSQL %d. A backlog of %d single-row likes (bigint columns, REPLICA IDENTITY FULL), "+
		"read to the end by the bare reader (section 2), once per variant, each from its own slot.\n\n"+
		"| variant | drain s | walsender CPU s | walsender µs/change |\n|---|---:|---:|---:|\n", c.pg.Major(), n)
	for _, v := range variants {
		b.logf("   %s", v.name)
		r, err := bareDrainOn(ctx, c.url, "bench_bin", v.slot, end, v.args...)
		if err != nil {
			return "", fmt.Errorf("%s: %w", v.name, err)
		}
		fmt.Fprintf(&out, "| %s | %.2f | %.2f | %.1f |\n", v.name, r.elapsed.Seconds(), r.sender.Seconds(), float64(r.sender.Microseconds())/float64(max(r.inserts, 1)))
	}
	out.WriteString("\n")
	return out.String(), nil
}
