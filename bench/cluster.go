package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/state"
)

// benchSettings are the settings of every cluster, on top of the servers
// package's defaults (wal_level=logical, fsync on). The same for every
// configuration, so that only the thing measured differs: enough memory
// that the tables stay cached, and WAL room so that no checkpoint is
// forced by WAL volume in the middle of a measurement.
var benchSettings = map[string]string{
	"shared_buffers":         "512MB",
	"max_wal_size":           "8GB",
	"min_wal_size":           "1GB",
	"checkpoint_timeout":     "30min",
	"synchronous_commit":     "on",
	"max_connections":        "100",
	"wal_writer_delay":       "200ms", // the default, stated
	"autovacuum_naptime":     "10s",
	"log_min_messages":       "warning",
	"log_checkpoints":        "on",
	"max_slot_wal_keep_size": "-1",
}

// schemaSQL is the app: posts with a counter column and likes that point
// at them, with the replica identity and the index a walcount user has.
const schemaSQL = `
CREATE TABLE posts (id bigint PRIMARY KEY, likes_count bigint NOT NULL DEFAULT 0);
CREATE TABLE likes (id bigserial PRIMARY KEY, post_id bigint NOT NULL, user_id bigint NOT NULL);
CREATE INDEX likes_post_id_idx ON likes (post_id);
ALTER TABLE likes REPLICA IDENTITY FULL;
`

// triggerSQL is the classic AFTER INSERT trigger that keeps the count.
const triggerSQL = `
CREATE FUNCTION likes_count_up() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE posts SET likes_count = likes_count + 1 WHERE id = NEW.post_id;
  RETURN NULL;
END $$;
CREATE TRIGGER likes_count_up AFTER INSERT ON likes FOR EACH ROW EXECUTE FUNCTION likes_count_up();
`

// backlogSQL builds a backlog inside the server: txns transactions of
// rows likes each, committed one by one, with random posts.
const backlogSQL = `
CREATE PROCEDURE bench_backlog(txns int, rows_per int, posts int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..txns LOOP
    INSERT INTO likes (post_id, user_id)
      SELECT 1 + floor(random() * posts)::bigint, g FROM generate_series(1, rows_per) g;
    COMMIT;
  END LOOP;
END $$;
`

// cluster is one throwaway PostgreSQL and Redis with the app schema.
type cluster struct {
	pg    *servers.Postgres
	redis *servers.Redis
	db    *pgxpool.Pool
	url   string
}

// newCluster starts a fresh cluster with posts 0..posts (post 0 is the
// freshness probe's).
func newCluster(ctx context.Context, posts int) (*cluster, error) {
	c, err := newBareCluster(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.db.Exec(ctx, schemaSQL); err != nil {
		c.close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	if _, err := c.db.Exec(ctx, `INSERT INTO posts (id) SELECT g FROM generate_series(0, $1::bigint) g`, posts); err != nil {
		c.close()
		return nil, fmt.Errorf("create posts: %w", err)
	}
	if _, err := c.db.Exec(ctx, `VACUUM ANALYZE posts`); err != nil {
		c.close()
		return nil, fmt.Errorf("vacuum posts: %w", err)
	}
	return c, nil
}

// newBareCluster starts a fresh cluster with no tables of the app.
func newBareCluster(ctx context.Context) (*cluster, error) {
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: benchSettings})
	if err != nil {
		return nil, err
	}
	c := &cluster{pg: pg, url: pg.URL()}
	if c.redis, err = servers.StartRedis(ctx, servers.RedisOptions{}); err != nil {
		c.close()
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(c.url)
	if err != nil {
		c.close()
		return nil, err
	}
	pcfg.MaxConns = 8
	if c.db, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// newSetUpCluster is newCluster with walcount set up on it (setup).
func newSetUpCluster(ctx context.Context, posts int) (*cluster, error) {
	c, err := newCluster(ctx, posts)
	if err != nil {
		return nil, err
	}
	if err := c.setup(ctx); err != nil {
		c.close()
		return nil, fmt.Errorf("walcount setup: %w", err)
	}
	return c, nil
}

func (c *cluster) close() {
	if c.db != nil {
		c.db.Close()
	}
	if c.redis != nil {
		c.redis.Close()
	}
	c.pg.Close()
}

// walcountConfig is the configuration the daemon runs with: every default.
func (c *cluster) walcountConfig() config.Config {
	cfg := config.Default()
	cfg.DatabaseURL = c.url
	cfg.RedisURL = c.redis.URL()
	return cfg
}

// setup runs walcount setup: publication, slot, checkpoint.
func (c *cluster) setup(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	cfg := c.walcountConfig()
	_, err = setup.Run(ctx, conn, setup.Options{Config: cfg})
	return err
}

// setupYAML writes a walcount config file of counters (yaml) to path and
// runs walcount setup with it, on the cluster's servers.
func (c *cluster) setupYAML(ctx context.Context, path, yaml string) error {
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return err
	}
	cfg, err := config.Load(path, func(string) (string, bool) { return "", false }, config.Overrides{})
	if err != nil {
		return err
	}
	cfg.DatabaseURL, cfg.RedisURL = c.url, c.redis.URL()
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := setup.Run(ctx, conn, setup.Options{Config: cfg}); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	return nil
}

// mark emits a logical message; once W passes its LSN, every transaction
// committed before it is applied.
func (c *cluster) mark(ctx context.Context) (cdc.LSN, error) {
	return cdc.EmitMessage(ctx, c.db, `{"bench":"mark"}`)
}

// waitCheckpoint waits until W passes lsn.
func (c *cluster) waitCheckpoint(ctx context.Context, lsn cdc.LSN, poll time.Duration) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		w, err := state.ReadCheckpoint(ctx, c.db, config.DefaultSlot)
		if err == nil && w > lsn {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for checkpoint %s past %s: %w", w, lsn, ctx.Err())
		case <-t.C:
		}
	}
}

// caughtUp waits until walcount has applied everything committed so far.
func (c *cluster) caughtUp(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	m, err := c.mark(ctx)
	if err != nil {
		return err
	}
	return c.waitCheckpoint(ctx, m, 20*time.Millisecond)
}

// errMismatch means a counter differs from COUNT(*).
var errMismatch = errors.New("likes_count differs from COUNT(*)")

// settled waits, within at most, until walcount has applied everything
// committed so far: W passes a mark, and walcount.carried is empty. A
// passed mark is not enough: a flush that applies a big batch in pieces,
// or that meets a locked row, moves W and carries the keys it did not
// apply yet to the next flushes (design rule 2), so a count read at that
// moment is off by exactly the carried deltas, and exact a moment later.
func (c *cluster) settled(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if err := c.caughtUp(ctx, within); err != nil {
		return err
	}
	for {
		n, err := c.carried(ctx)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for walcount.carried to drain (%d keys left): %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// carried returns the rows of walcount.carried.
func (c *cluster) carried(ctx context.Context) (int64, error) {
	var n int64
	err := c.db.QueryRow(ctx, `SELECT count(*) FROM walcount.carried`).Scan(&n)
	return n, err
}

// verifySettled waits until walcount has settled, then verifies.
func (c *cluster) verifySettled(ctx context.Context) error {
	if err := c.settled(ctx, time.Minute); err != nil {
		return err
	}
	return c.verify(ctx)
}

// verify compares every post with COUNT(*). When posts are off it says
// which (the first few, with both values) and how many of them
// walcount.carried still holds, with their deltas.
func (c *cluster) verify(ctx context.Context) error {
	var bad, total int64
	err := c.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE p.likes_count <> coalesce(l.n, 0)), count(*)
FROM posts p LEFT JOIN (SELECT post_id, count(*) AS n FROM likes GROUP BY post_id) l ON l.post_id = p.id`).Scan(&bad, &total)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if bad > 0 {
		return fmt.Errorf("verify: %d of %d posts off%s: %w", bad, total, c.offDiagnostic(ctx), errMismatch)
	}
	return nil
}

// offDiagnostic describes the posts that are off: the first ten, and how
// many are carried (and whether their carried deltas are what they lack).
func (c *cluster) offDiagnostic(ctx context.Context) string {
	var (
		first                 []string
		carriedOff, explained int64
		carriedAll, parkedAll int64
	)
	rows, err := c.db.Query(ctx, `WITH off AS (
  SELECT p.id, p.likes_count, coalesce(l.n, 0) AS truth
  FROM posts p LEFT JOIN (SELECT post_id, count(*) AS n FROM likes GROUP BY post_id) l ON l.post_id = p.id
  WHERE p.likes_count <> coalesce(l.n, 0))
SELECT off.id, off.likes_count, off.truth, cr.delta
FROM off LEFT JOIN (SELECT key, sum(delta) AS delta FROM walcount.carried GROUP BY key) cr ON cr.key = off.id::text
ORDER BY off.id`)
	if err != nil {
		return fmt.Sprintf(" (diagnostic: %v)", err)
	}
	for rows.Next() {
		var id, cached, truth int64
		var delta *int64
		if err := rows.Scan(&id, &cached, &truth, &delta); err != nil {
			rows.Close()
			return fmt.Sprintf(" (diagnostic: %v)", err)
		}
		if len(first) < 10 {
			d := "not carried"
			if delta != nil {
				d = fmt.Sprintf("carried %+d", *delta)
			}
			first = append(first, fmt.Sprintf("%d: %d, truth %d, %s", id, cached, truth, d))
		}
		if delta != nil {
			carriedOff++
			if cached+*delta == truth {
				explained++
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Sprintf(" (diagnostic: %v)", err)
	}
	_ = c.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE parked_error IS NOT NULL) FROM walcount.carried`).Scan(&carriedAll, &parkedAll)
	return fmt.Sprintf(" (%s; %d of them in walcount.carried, %d exactly by their carried delta; %d keys carried, %d parked)",
		strings.Join(first, "; "), carriedOff, explained, carriedAll, parkedAll)
}

// postUpdates returns n_tup_upd of posts. Backends report their table
// statistics when idle or when they exit: close the connections that
// wrote before reading it.
func (c *cluster) postUpdates(ctx context.Context) (int64, error) {
	var n int64
	// A fresh connection reads a fresh statistics snapshot.
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'posts'::regclass`).Scan(&n)
	return n, err
}

// redisScriptCalls returns how many scripts (EVALSHA and EVAL) Redis has
// run: walcount writes to Redis only through scripts.
func (c *cluster) redisScriptCalls(ctx context.Context) (int64, error) {
	ropt, err := redisconn.Parse(c.redis.URL(), redisconn.TLSOptions{})
	if err != nil {
		return 0, err
	}
	rdb := redisconn.New(ropt, nil)
	defer rdb.Close()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				n, err := strconv.ParseInt(calls, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse %q: %w", line, err)
				}
				total += n
			}
		}
	}
	return total, nil
}

// likesCount returns COUNT(*) of likes.
func (c *cluster) likesCount(ctx context.Context) (int64, error) {
	var n int64
	err := c.db.QueryRow(ctx, `SELECT count(*) FROM likes`).Scan(&n)
	return n, err
}

// checkpoint returns W.
func (c *cluster) checkpoint(ctx context.Context) (cdc.LSN, error) {
	return state.ReadCheckpoint(ctx, c.db, config.DefaultSlot)
}

// senderCPU returns the CPU time of the walsender that serves slot.
func (c *cluster) senderCPU(ctx context.Context, slot string) (time.Duration, error) {
	var pid *int32
	if err := c.db.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid); err != nil {
		return 0, fmt.Errorf("read walsender pid: %w", err)
	}
	if pid == nil {
		return 0, fmt.Errorf("slot %q has no walsender", slot)
	}
	u, err := procUsage(int(*pid))
	return u.cpu, err
}
