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
	id, err := identityArms(ctx, b, c)
	if err != nil {
		return "", err
	}
	out.WriteString(id)
	return out.String(), nil
}

// identityDDL makes two copies of a likes table as apps keep it (the
// timestamps a Rails model adds), one with REPLICA IDENTITY FULL, one
// with REPLICA IDENTITY USING INDEX over (post_id, user_id), which
// walcount check advises when such an index holds every column the
// counters read; and a procedure that deletes their rows one per
// transaction.
const identityDDL = `
CREATE TABLE likes_full (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());
CREATE UNIQUE INDEX likes_full_post_user ON likes_full (post_id, user_id);
ALTER TABLE likes_full REPLICA IDENTITY FULL;
CREATE TABLE likes_idx (LIKE likes_full INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE likes_idx ADD PRIMARY KEY (id);
CREATE UNIQUE INDEX likes_idx_post_user ON likes_idx (post_id, user_id);
ALTER TABLE likes_idx REPLICA IDENTITY USING INDEX likes_idx_post_user;
CREATE PUBLICATION bench_full FOR TABLE likes_full;
CREATE PUBLICATION bench_idx FOR TABLE likes_idx;
CREATE PROCEDURE bench_delete_backlog(t regclass, lo bigint, hi bigint) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN lo..hi LOOP
    EXECUTE format('DELETE FROM %s WHERE id = $1', t) USING i;
    COMMIT;
  END LOOP;
END $$;
`

// identityArms measures what the replica identity costs the walsender on
// DELETE: a backlog of single-row deletes from each table, each read by
// the bare reader from a slot made just before it, so that a slot decodes
// its own backlog only; twice each, alternating.
func identityArms(ctx context.Context, b *bench, c *cluster) (string, error) {
	n := b.backlog / 4
	if _, err := c.db.Exec(ctx, identityDDL); err != nil {
		return "", err
	}
	for _, t := range []string{"likes_full", "likes_idx"} {
		if _, err := c.db.Exec(ctx, `INSERT INTO `+t+` (id, post_id, user_id) SELECT g, 1 + g % 1000, g FROM generate_series(1, $1::bigint) g`, 2*n); err != nil {
			return "", err
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "DELETE and the replica identity: %d single-row deletes from a likes table with the timestamps of an app's model "+
		"(id, post_id, user_id, created_at, updated_at), once with REPLICA IDENTITY FULL, once USING INDEX over (post_id, user_id) "+
		"(walcount check's advice), each read by the bare reader from a slot made just before its backlog.\n\n"+
		"| identity | drain s | walsender CPU s | walsender µs/change |\n|---|---:|---:|---:|\n", n)
	arms := []struct {
		name, table, pub string
		round            int64
	}{
		{"FULL", "likes_full", "bench_full", 0},
		{"USING INDEX (post_id, user_id)", "likes_idx", "bench_idx", 0},
		{"USING INDEX again", "likes_idx", "bench_idx", 1},
		{"FULL again", "likes_full", "bench_full", 1},
	}
	for i, a := range arms {
		b.logf("   DELETE, identity %s", a.name)
		slot := fmt.Sprintf("id_%d", i)
		if _, err := c.db.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			return "", err
		}
		conn, err := c.db.Acquire(ctx)
		if err != nil {
			return "", err
		}
		lo := 1 + a.round*n
		_, err = conn.Exec(ctx, `SET synchronous_commit = off`)
		if err == nil {
			_, err = conn.Exec(ctx, `CALL bench_delete_backlog($1::regclass, $2, $3)`, a.table, lo, lo+n-1)
		}
		conn.Release()
		if err != nil {
			return "", fmt.Errorf("delete backlog: %w", err)
		}
		var endText string
		if err := c.db.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&endText); err != nil {
			return "", err
		}
		end, err := pglogrepl.ParseLSN(endText)
		if err != nil {
			return "", err
		}
		// A transaction of the table past the backlog ends the drain.
		if _, err := c.db.Exec(ctx, `INSERT INTO `+a.table+` (id, post_id, user_id) VALUES ($1, 0, $1)`, -1-int64(i)); err != nil {
			return "", err
		}
		r, err := bareDrainOn(ctx, c.url, a.pub, slot, end)
		if err != nil {
			return "", fmt.Errorf("identity %s: %w", a.name, err)
		}
		if _, err := c.db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
			return "", err
		}
		fmt.Fprintf(&out, "| %s | %.2f | %.2f | %.1f |\n", a.name, r.elapsed.Seconds(), r.sender.Seconds(), float64(r.sender.Microseconds())/float64(max(r.deletes, 1)))
	}
	out.WriteString("\n")
	return out.String(), nil
}
