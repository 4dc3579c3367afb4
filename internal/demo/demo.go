package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/config"
	"github.com/walcount/walcount/internal/daemon"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/redact"
	"github.com/walcount/walcount/internal/servers"
	"github.com/walcount/walcount/internal/setup"
	"github.com/walcount/walcount/sink"
)

// Defaults of Options.
const (
	DefaultDuration = 20 * time.Second
	DefaultClients  = 8
	DefaultPosts    = 1000
	// DefaultSettleTimeout bounds the wait for the counts to settle after
	// the load stops.
	DefaultSettleTimeout = 2 * time.Minute
)

// Timing of the demo's moving parts.
const (
	// frameInterval is how often the live view is drawn.
	frameInterval = time.Second
	// lagWindow is the window of the apply-lag quantiles in the view.
	lagWindow = 5 * time.Second
	// topPosts is how many posts the view lists.
	topPosts = 5
	// slotPollInterval is how often the slot monitor reads the slot's
	// lag for the view (the daemon's default is 5 s).
	slotPollInterval = time.Second
	// streamingTimeout bounds the wait for the daemon's first session.
	streamingTimeout = time.Minute
	// cleanupTimeout bounds the cleanup on servers the demo does not own.
	cleanupTimeout = 30 * time.Second
	// maxReported is how many mismatches the verdict lists.
	maxReported = 20
)

// demoSettings are the throwaway cluster's settings on top of the
// servers package's defaults (wal_level=logical and enough slots). A
// bounded max_slot_wal_keep_size is what production should have too; -1
// makes the daemon warn about an unbounded slot.
var demoSettings = map[string]string{"max_slot_wal_keep_size": "2GB"}

// Options configure Run. Zero values take the defaults.
type Options struct {
	// DatabaseURL names an existing PostgreSQL (wal_level=logical, a
	// superuser or a role that may create slots). "" starts a throwaway
	// cluster from the local binaries.
	DatabaseURL string
	// RedisURL names an existing Redis. "" starts a throwaway redis-server.
	RedisURL string
	// Duration of the load; default DefaultDuration.
	Duration time.Duration
	// Clients is the number of concurrent app clients; default
	// DefaultClients.
	Clients int
	// Posts is the number of posts; default DefaultPosts, at least 2.
	Posts int
	// FlushInterval is the daemon's flush interval; 0 means
	// config.DefaultFlushInterval.
	FlushInterval time.Duration
	// SettleTimeout: default DefaultSettleTimeout.
	SettleTimeout time.Duration
	// Out receives the live view and the verdict; nil discards them.
	Out io.Writer
	// Terminal redraws the view in place with ANSI escape sequences
	// instead of printing a line per second.
	Terminal bool
	// Logger receives the daemon's and the servers' logs; nil means none.
	Logger *zap.Logger
}

// Result is the demo's outcome.
type Result struct {
	// Posts is the number of posts verified.
	Posts int
	// Likes and Unlikes are the rows the app inserted and deleted;
	// Transactions counts its committed transactions.
	Likes, Unlikes, Transactions int64
	// AppErrors counts failed app operations (they changed nothing).
	AppErrors int64
	// Rows is COUNT(*) of likes at the end.
	Rows int64
	// Settle is how long the counts took to settle after the load stopped.
	Settle time.Duration
	// LagP50 and LagP99 are walcount_apply_lag_seconds quantiles over the
	// whole run.
	LagP50, LagP99 float64
	// Mismatches lists the posts whose likes_count differs from COUNT(*),
	// at most 20 of them; MismatchCount counts them all.
	Mismatches    []PostCount
	MismatchCount int
}

// Exact reports whether every post's likes_count equals its COUNT(*).
func (r Result) Exact() bool { return r.MismatchCount == 0 && r.Posts > 0 }

// Run runs the demo; see the package documentation. Cancelling ctx ends
// the load early; the counts are still settled and verified. The error is
// about the demo's machinery (a server that did not start, a daemon that
// failed); a count mismatch is reported in Result, not as an error.
func Run(ctx context.Context, opt Options) (res Result, err error) {
	opt = withDefaults(opt)
	if opt.Posts < 2 {
		return res, errNoPosts
	}
	out := opt.Out
	// Cleanup runs after ctx is cancelled: it must not depend on it.
	bg := context.WithoutCancel(ctx)

	dbURL, redisURL := opt.DatabaseURL, opt.RedisURL
	if dbURL == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL (wal_level=logical) from the local binaries…")
		pg, err := servers.StartPostgres(bg, servers.PostgresOptions{Settings: demoSettings, Logger: opt.Logger})
		if err != nil {
			return res, err
		}
		defer pg.Close()
		dbURL = pg.URL()
	}
	if redisURL == "" {
		fmt.Fprintln(out, "starting a throwaway redis-server…")
		rs, err := servers.StartRedis(bg, servers.RedisOptions{Logger: opt.Logger})
		if err != nil {
			return res, err
		}
		defer rs.Close()
		redisURL = rs.URL()
	}
	fmt.Fprintf(out, "postgres %s, redis %s\n", redact.URL(dbURL), redact.URL(redisURL))

	db, err := pgxpool.New(bg, dbURL)
	if err != nil {
		return res, fmt.Errorf("connect to postgres: %w", redactedErr{err})
	}
	defer db.Close()
	ropt, err := redis.ParseURL(redisURL)
	if err != nil {
		return res, fmt.Errorf("parse redis url: %w", redactedErr{err})
	}
	rdb := redis.NewClient(ropt)
	defer rdb.Close()

	// Start from nothing: an earlier demo that was killed may have left
	// its slot, which would replay old changes into the new tables.
	if err := dropAll(bg, db, rdb); err != nil {
		return res, err
	}
	if opt.DatabaseURL != "" || opt.RedisURL != "" {
		defer func() {
			cctx, cancel := context.WithTimeout(bg, cleanupTimeout)
			defer cancel()
			if cerr := dropAll(cctx, db, rdb); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	if err := createSchema(bg, db, opt.Posts); err != nil {
		return res, err
	}
	cfg := daemonConfig(dbURL, redisURL, opt.FlushInterval)
	if err := runSetup(bg, dbURL, cfg); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "created %s.posts (%d posts) and %s.likes; ran walcount setup (slot %q)\n",
		Schema, opt.Posts, Schema, Slot)

	m := metrics.New()
	d, err := daemon.New(daemon.Options{Config: cfg, Metrics: m, Logger: opt.Logger})
	if err != nil {
		return res, err
	}
	defer d.Close()
	dctx, stopDaemon := context.WithCancel(bg)
	daemonDone := make(chan error, 1)
	go func() { daemonDone <- d.Run(dctx) }()
	// The daemon stops before the deferred cleanup and Close above: its
	// final flush needs both servers, and a slot in use cannot be dropped.
	defer func() {
		stopDaemon()
		if derr := <-daemonDone; derr != nil && err == nil {
			err = fmt.Errorf("walcount daemon: %w", derr)
		}
	}()
	if err := waitStreaming(ctx, d, daemonDone); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "walcount is streaming (flush interval %s); starting %d clients for %s\n\n",
		cfg.FlushInterval, opt.Clients, opt.Duration)

	lg := newLoad(db, opt.Posts)
	lagStart := histogramBuckets(m.ApplyLag)
	if err := runLoad(ctx, opt, lg, db, m, daemonDone); err != nil {
		return res, err
	}
	res.Likes, res.Unlikes, res.Transactions = lg.likes.Load(), lg.unlikes.Load(), lg.txns.Load()
	res.AppErrors = lg.errs.Load()
	if res.AppErrors > 0 {
		fmt.Fprintf(out, "note: %d app operations failed (they changed nothing); last: %v\n", res.AppErrors, lg.err())
	}

	fmt.Fprintln(out, "\nload stopped; waiting for walcount to apply everything committed…")
	settleStart := time.Now()
	sctx, cancel := context.WithTimeout(bg, opt.SettleTimeout)
	defer cancel()
	if err := settle(sctx, db, daemonDone); err != nil {
		return res, err
	}
	res.Settle = time.Since(settleStart)
	applied := SubBuckets(histogramBuckets(m.ApplyLag), lagStart)
	res.LagP50, res.LagP99 = Quantile(0.5, applied), Quantile(0.99, applied)

	if err := verify(bg, db, &res); err != nil {
		return res, err
	}
	printVerdict(out, res)
	return res, nil
}

func withDefaults(opt Options) Options {
	if opt.Duration <= 0 {
		opt.Duration = DefaultDuration
	}
	if opt.Clients <= 0 {
		opt.Clients = DefaultClients
	}
	if opt.Posts == 0 {
		opt.Posts = DefaultPosts
	}
	if opt.FlushInterval <= 0 {
		opt.FlushInterval = config.DefaultFlushInterval
	}
	if opt.SettleTimeout <= 0 {
		opt.SettleTimeout = DefaultSettleTimeout
	}
	if opt.Out == nil {
		opt.Out = io.Discard
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	return opt
}

// daemonConfig is walcount's configuration for the demo: the defaults,
// with the demo's counter, slot and publication.
func daemonConfig(dbURL, redisURL string, flush time.Duration) config.Config {
	cfg := config.Default()
	cfg.DatabaseURL = dbURL
	cfg.RedisURL = redisURL
	cfg.Slot = Slot
	cfg.Publication = Publication
	cfg.Counters = []config.Counter{Counter()}
	cfg.FlushInterval = flush
	cfg.HTTPAddr = ""
	cfg.SlotSettings.PollInterval = slotPollInterval
	return cfg
}

// runSetup is `walcount setup` for the demo's configuration.
func runSetup(ctx context.Context, dbURL string, cfg config.Config) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", redactedErr{err})
	}
	defer conn.Close(context.Background())
	if _, err := setup.Run(ctx, conn, setup.Options{Slot: cfg.Slot, Publication: cfg.Publication, Counters: cfg.Counters}); err != nil {
		return fmt.Errorf("walcount setup: %w", err)
	}
	return nil
}

// waitStreaming waits until the daemon's first session streams.
func waitStreaming(ctx context.Context, d *daemon.Daemon, daemonDone <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, streamingTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		st := d.Status(ctx)
		if st.Streaming {
			return nil
		}
		select {
		case err := <-daemonDone:
			return fmt.Errorf("walcount daemon stopped before streaming: %w", errOrStopped(err))
		case <-ctx.Done():
			if st.LastError != "" {
				return fmt.Errorf("wait for walcount to stream: %w (last error: %s)", ctx.Err(), st.LastError)
			}
			return fmt.Errorf("wait for walcount to stream: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func errOrStopped(err error) error {
	if err == nil {
		return errors.New("stopped")
	}
	return err
}

// runLoad runs the app for opt.Duration (or until ctx is done) and draws
// the view once a second.
func runLoad(ctx context.Context, opt Options, lg *load, db *pgxpool.Pool, m *metrics.Metrics, daemonDone <-chan error) error {
	lctx, stop := context.WithTimeout(ctx, opt.Duration)
	defer stop()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		lg.run(lctx, opt.Clients)
	}()

	v := &view{w: opt.Out, terminal: opt.Terminal}
	defer v.done()
	s := newSampler(lg, m)
	start := time.Now()
	var lastTop []PostCount
	var lastRows int64
	t := time.NewTicker(frameInterval)
	defer t.Stop()
	for {
		select {
		case err := <-daemonDone:
			stop()
			<-loadDone
			return fmt.Errorf("walcount daemon stopped during the demo: %w", errOrStopped(err))
		case <-loadDone:
			if ctx.Err() != nil {
				v.done()
				fmt.Fprintln(opt.Out, "\ninterrupted: the load stopped early")
			}
			return nil
		case <-t.C:
		}
		f := s.frame(time.Since(start))
		f.Duration, f.Clients, f.Posts, f.Viral = opt.Duration, opt.Clients, opt.Posts, lg.viral
		qctx, cancel := context.WithTimeout(ctx, frameInterval)
		top, rows, err := readTop(qctx, db)
		cancel()
		if err == nil {
			lastTop, lastRows = top, rows
		}
		f.Top, f.Rows = lastTop, lastRows
		v.draw(f)
	}
}

// sampler turns cumulative counters into per-second rates between frames.
type sampler struct {
	lg   *load
	m    *metrics.Metrics
	last struct {
		at                   time.Time
		likes, unlikes, txns int64
		walTxns              float64
	}
	lags []windowed // apply-lag buckets of the last lagWindow
}

type windowed struct {
	at      time.Time
	buckets []Bucket
}

func newSampler(lg *load, m *metrics.Metrics) *sampler {
	s := &sampler{lg: lg, m: m}
	s.last.at = time.Now()
	s.last.walTxns = counterValue(m.Transactions)
	s.lags = []windowed{{at: s.last.at, buckets: histogramBuckets(m.ApplyLag)}}
	return s
}

func (s *sampler) frame(elapsed time.Duration) Frame {
	now := time.Now()
	dt := now.Sub(s.last.at).Seconds()
	likes, unlikes, txns := s.lg.likes.Load(), s.lg.unlikes.Load(), s.lg.txns.Load()
	walTxns := counterValue(s.m.Transactions)
	f := Frame{
		Elapsed:       elapsed,
		LikesPerSec:   float64(likes-s.last.likes) / dt,
		UnlikesPerSec: float64(unlikes-s.last.unlikes) / dt,
		AppTxnsPerSec: float64(txns-s.last.txns) / dt,
		TxnsPerSec:    (walTxns - s.last.walTxns) / dt,
		Flushes:       int64(counterValue(s.m.Flushes)),
		SlotLagBytes:  gaugeValue(s.m.SlotLagBytes),
		Errors:        s.lg.errs.Load(),
	}
	s.last.at, s.last.likes, s.last.unlikes, s.last.txns, s.last.walTxns = now, likes, unlikes, txns, walTxns

	cur := histogramBuckets(s.m.ApplyLag)
	s.lags = append(s.lags, windowed{at: now, buckets: cur})
	for len(s.lags) > 2 && now.Sub(s.lags[1].at) >= lagWindow {
		s.lags = s.lags[1:]
	}
	win := SubBuckets(cur, s.lags[0].buckets)
	f.LagP50, f.LagP99 = Quantile(0.5, win), Quantile(0.99, win)
	return f
}

var (
	posts = pgx.Identifier{Schema, "posts"}.Sanitize()
	// topQuery reads the hottest posts' cached counts next to the truth,
	// in one snapshot, so the difference is what is in flight.
	topQuery = `SELECT p.id, p.likes_count, (SELECT count(*) FROM ` + likes + ` l WHERE l.post_id = p.id),
  (SELECT count(*) FROM ` + likes + `)
FROM ` + posts + ` p ORDER BY p.likes_count DESC, p.id LIMIT $1`
)

// readTop returns the topPosts posts with the highest likes_count and the
// total number of likes rows.
func readTop(ctx context.Context, db *pgxpool.Pool) ([]PostCount, int64, error) {
	rows, err := db.Query(ctx, topQuery, topPosts)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var top []PostCount
	var total int64
	for rows.Next() {
		var p PostCount
		if err := rows.Scan(&p.ID, &p.LikesCount, &p.Count, &total); err != nil {
			return nil, 0, err
		}
		top = append(top, p)
	}
	return top, total, rows.Err()
}

// settle waits until walcount's checkpoint passes a marker emitted now:
// every transaction committed before the marker is then in the counter
// columns (DESIGN §2 rule 1).
func settle(ctx context.Context, db *pgxpool.Pool, daemonDone <-chan error) error {
	marker, err := cdc.EmitMessage(ctx, db, `{"demo":"settle"}`)
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var w cdc.LSN
	for {
		w, err = sink.ReadCheckpoint(ctx, db, Slot)
		if err == nil && w > marker {
			return nil
		}
		select {
		case derr := <-daemonDone:
			return fmt.Errorf("settle: walcount daemon stopped: %w", errOrStopped(derr))
		case <-ctx.Done():
			return fmt.Errorf("settle: checkpoint %s did not pass the marker %s: %w", w, marker, ctx.Err())
		case <-t.C:
		}
	}
}

// verifyQuery lists every post whose likes_count differs from COUNT(*).
var verifyQuery = `SELECT p.id, p.likes_count, count(l.id)
FROM ` + posts + ` p LEFT JOIN ` + likes + ` l ON l.post_id = p.id
GROUP BY p.id, p.likes_count
HAVING p.likes_count <> count(l.id)
ORDER BY p.id`

// verify compares every post with COUNT(*), in one snapshot.
func verify(ctx context.Context, db *pgxpool.Pool, res *Result) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read-only
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+posts+`), (SELECT count(*) FROM `+likes+`)`).
		Scan(&res.Posts, &res.Rows); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	rows, err := tx.Query(ctx, verifyQuery)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p PostCount
		if err := rows.Scan(&p.ID, &p.LikesCount, &p.Count); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		res.MismatchCount++
		if len(res.Mismatches) < maxReported {
			res.Mismatches = append(res.Mismatches, p)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

func printVerdict(out io.Writer, r Result) {
	fmt.Fprintf(out, "settled in %s; the app made %s likes and %s unlikes in %s transactions; apply lag p50 %s, p99 %s\n",
		r.Settle.Round(time.Millisecond), num(float64(r.Likes)), num(float64(r.Unlikes)), num(float64(r.Transactions)),
		lag(r.LagP50), lag(r.LagP99))
	if r.Exact() {
		fmt.Fprintf(out, "verdict: EXACT: all %s posts have likes_count = COUNT(*) (%s likes rows)\n",
			num(float64(r.Posts)), num(float64(r.Rows)))
		return
	}
	fmt.Fprintf(out, "verdict: MISMATCH: %d of %d posts have likes_count <> COUNT(*):\n", r.MismatchCount, r.Posts)
	for _, p := range r.Mismatches {
		fmt.Fprintf(out, "  post %d: likes_count %d, COUNT(*) %d\n", p.ID, p.LikesCount, p.Count)
	}
	if r.MismatchCount > len(r.Mismatches) {
		fmt.Fprintf(out, "  … and %d more\n", r.MismatchCount-len(r.Mismatches))
	}
}

// redactedErr masks credentials that a driver error may echo.
type redactedErr struct{ err error }

func (e redactedErr) Error() string { return redact.URL(e.err.Error()) }
func (e redactedErr) Unwrap() error { return e.err }
