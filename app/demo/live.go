package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcount/walcount/internal/metrics"
)

// runLoad runs the app for opt.Duration (or until ctx is done) and draws
// the view once a second.
func runLoad(ctx context.Context, opt Options, lg *load, db *pgxpool.Pool, m *metrics.Metrics, lags *lagRecorder, daemonDone <-chan error) error {
	lctx, stop := context.WithTimeout(ctx, opt.Duration)
	defer stop()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		lg.run(lctx, opt.Clients)
	}()

	v := &view{w: opt.Out, terminal: opt.Terminal}
	defer v.done()
	s := newSampler(lg, m, lags)
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
	lags *lagRecorder
	last struct {
		at                   time.Time
		likes, unlikes, txns int64
		walTxns              float64
	}
}

func newSampler(lg *load, m *metrics.Metrics, lags *lagRecorder) *sampler {
	s := &sampler{lg: lg, m: m, lags: lags}
	s.last.at = time.Now()
	s.last.walTxns = counterValue(m.Transactions)
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
	f.LagP50, f.LagP99 = s.lags.quantiles(now.Add(-lagWindow))
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
