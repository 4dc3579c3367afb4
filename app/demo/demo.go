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

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/redact"
	"github.com/walcount/walcount/internal/redisconn"
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

// PostgresSettings are the throwaway cluster's settings on top of the
// test kit's defaults (wal_level=logical and enough slots). A bounded
// max_slot_wal_keep_size is what production should have too; -1 makes the
// daemon warn about an unbounded slot.
var PostgresSettings = map[string]string{"max_slot_wal_keep_size": "2GB"}

// errNoServers is Run's error without both URLs and without Servers.
var errNoServers = errors.New("walcount demo runs against the servers that --database-url and --redis-url name (both); `make demo` starts throwaway ones and passes them")

// Options configure Run. Zero values take the defaults.
type Options struct {
	// DatabaseURL names an existing PostgreSQL (wal_level=logical, a
	// superuser or a role that may create slots).
	DatabaseURL string
	// RedisURL names an existing Redis.
	RedisURL string
	// Servers, when both URLs are empty, starts a throwaway PostgreSQL
	// (with settings on top of its defaults) and Redis and returns their
	// URLs and what stops them. The walcount binary leaves it nil: it
	// carries no code that starts servers. The test kit's
	// servers.Throwaway is one (make demo's entry point and the tests).
	Servers func(ctx context.Context, settings map[string]string) (dbURL, redisURL string, stop func(), err error)
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
	// LagP50 and LagP99 are apply-lag quantiles over the whole load, from
	// every observation of walcount_apply_lag_seconds.
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

	sv, err := openServers(bg, opt)
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := sv.close(bg); cerr != nil && err == nil {
			err = cerr
		}
	}()
	dbURL, redisURL, db := sv.dbURL, sv.redisURL, sv.db
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
	lags := newLagRecorder(m.ApplyLag)
	m.ApplyLag = lags
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
	lagStart := time.Now()
	if err := runLoad(ctx, opt, lg, db, m, lags, daemonDone); err != nil {
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
	res.LagP50, res.LagP99 = lags.quantiles(lagStart)

	if err := verify(bg, db, &res); err != nil {
		return res, err
	}
	printVerdict(out, res)
	return res, nil
}

// demoServers are the demo's PostgreSQL and Redis, connected and emptied of
// an earlier demo's tables, slot and keys.
type demoServers struct {
	dbURL, redisURL string
	db              *pgxpool.Pool
	rdb             redis.UniversalClient
	// given: the URLs are the user's, so close drops what the demo made.
	given bool
	stop  func() // the throwaway servers', or nil
}

// openServers connects to the servers of opt's URLs, or starts throwaway
// ones (opt.Servers) when none is given, and drops whatever an earlier
// demo left.
func openServers(bg context.Context, opt Options) (_ *demoServers, err error) {
	sv := &demoServers{dbURL: opt.DatabaseURL, redisURL: opt.RedisURL, given: opt.DatabaseURL != "" || opt.RedisURL != ""}
	defer func() {
		if err != nil {
			sv.closeConns()
		}
	}()
	if sv.dbURL == "" || sv.redisURL == "" {
		if opt.Servers == nil || sv.given {
			return nil, errNoServers
		}
		fmt.Fprintln(opt.Out, "starting a throwaway PostgreSQL (wal_level=logical) and redis-server from the local binaries…")
		if sv.dbURL, sv.redisURL, sv.stop, err = opt.Servers(bg, PostgresSettings); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(opt.Out, "postgres %s, redis %s\n", redact.URL(sv.dbURL), redact.URL(sv.redisURL))

	if sv.db, err = pgxpool.New(bg, sv.dbURL); err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", redactedErr{err})
	}
	ropt, err := redisconn.Parse(sv.redisURL, redisconn.TLSOptions{})
	if err != nil {
		return nil, fmt.Errorf("parse redis url: %w", redactedErr{err})
	}
	sv.rdb = redisconn.New(ropt, opt.Logger)

	// Start from nothing: an earlier demo that was killed may have left
	// its slot, which would replay old changes into the new tables.
	if err := dropAll(bg, sv.db, sv.rdb); err != nil {
		return nil, err
	}
	return sv, nil
}

// close drops what the demo made on servers the user gave, then closes
// the connections and stops throwaway servers.
func (sv *demoServers) close(bg context.Context) error {
	var err error
	if sv.given {
		cctx, cancel := context.WithTimeout(bg, cleanupTimeout)
		err = dropAll(cctx, sv.db, sv.rdb)
		cancel()
	}
	sv.closeConns()
	return err
}

// closeConns closes what openServers opened, last first.
func (sv *demoServers) closeConns() {
	if sv.rdb != nil {
		sv.rdb.Close()
	}
	if sv.db != nil {
		sv.db.Close()
	}
	if sv.stop != nil {
		sv.stop()
	}
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
	cfg.Counters = []counter.Counter{Counter()}
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
	if _, err := setup.Run(ctx, conn, setup.Options{Config: cfg}); err != nil {
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

// redactedErr masks credentials that a driver error may echo.
type redactedErr struct{ err error }

func (e redactedErr) Error() string { return redact.URL(e.err.Error()) }
func (e redactedErr) Unwrap() error { return e.err }
