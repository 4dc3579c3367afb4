package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/stats"
)

// The app's side (section 8): what the app's own transactions on the
// target rows see, without walcount and with it, while one post's row is
// held by a long transaction and likes go to every post.
const (
	// appPosts posts get likes at appLikeRate likes/s, uniformly.
	appPosts    = 1000
	appLikeRate = 300
	// appHeldPost is the post an admin edit holds for the whole window.
	appHeldPost = 1
	// appPairA and appPairB are the two hot posts another client updates
	// in one transaction, in random order.
	appPairA, appPairB = 2, 3
	// appThink is that client's pause between its two updates.
	appThink = 3 * time.Millisecond
)

// appSideResult is one configuration of section 8.
type appSideResult struct {
	walcount bool
	// edits are the latencies of single-row title updates of other posts
	// (not the held one), sorted.
	edits []time.Duration
	// pairs counts the two-post transactions, deadlocks those that
	// failed with 40P01, otherErrs those that failed otherwise.
	pairs, deadlocks, otherErrs int64
	likes                       int64
	// exact: every post equals COUNT(*) once the row is free (with
	// walcount only).
	exact bool
}

func (r appSideResult) edit(q float64) time.Duration { return stats.Quantile(r.edits, q) }

// runAppSide runs section 8 without walcount, then with it.
func runAppSide(ctx context.Context, b *bench) ([]appSideResult, error) {
	var out []appSideResult
	for _, with := range []bool{false, true} {
		r, err := runAppSideOnce(ctx, b, with)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runAppSideOnce(ctx context.Context, b *bench, with bool) (appSideResult, error) {
	res := appSideResult{walcount: with}
	c, err := newCluster(ctx, appPosts)
	if err != nil {
		return res, err
	}
	defer c.close()
	if _, err := c.db.Exec(ctx, `ALTER TABLE posts ADD COLUMN title text NOT NULL DEFAULT ''`); err != nil {
		return res, err
	}
	if with {
		if err := c.setup(ctx); err != nil {
			return res, err
		}
		wc, err := startReady(ctx, b, c)
		if err != nil {
			return res, err
		}
		defer wc.stop()
	}
	window := 15 * time.Second
	if b.quick {
		window = 5 * time.Second
	}
	holder, err := c.db.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer holder.Rollback(context.Background()) //nolint:errcheck // after the window
	if _, err := holder.Exec(ctx, `SELECT 1 FROM posts WHERE id = $1 FOR UPDATE`, appHeldPost); err != nil {
		return res, err
	}
	conns, closeAll, err := connectAll(ctx, c.url, 2)
	if err != nil {
		return res, err
	}
	defer closeAll()
	lctx, stop := context.WithTimeout(ctx, window)
	defer stop()
	var wg sync.WaitGroup
	var loadErr, editErr error
	wg.Go(func() {
		res.likes, loadErr = pacedLoad(lctx, c.url, 4, appLikeRate, workload{name: "uniform", uniform: appPosts})
	})
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(8, 1))
		for i := 0; lctx.Err() == nil; i++ {
			post := int64(appPairB + 1 + rng.IntN(appPosts-appPairB))
			start := time.Now()
			if _, err := conns[0].Exec(context.WithoutCancel(lctx), `UPDATE posts SET title = $2 WHERE id = $1`, post, fmt.Sprint(i)); err != nil {
				editErr = fmt.Errorf("title update: %w", err)
				return
			}
			res.edits = append(res.edits, time.Since(start))
		}
	})
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(8, 2))
		for i := 0; lctx.Err() == nil; i++ {
			a, b := int64(appPairA), int64(appPairB)
			if rng.IntN(2) == 0 {
				a, b = b, a
			}
			err := pgx.BeginFunc(context.WithoutCancel(lctx), conns[1], func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE posts SET title = $2 WHERE id = $1`, a, fmt.Sprint(i)); err != nil {
					return err
				}
				time.Sleep(appThink)
				_, err := tx.Exec(ctx, `UPDATE posts SET title = $2 WHERE id = $1`, b, fmt.Sprint(i))
				return err
			})
			res.pairs++
			var pe *pgconn.PgError
			switch {
			case err == nil:
			case errors.As(err, &pe) && pe.Code == "40P01":
				res.deadlocks++
			default:
				res.otherErrs++
			}
		}
	})
	wg.Wait()
	if err := holder.Rollback(ctx); err != nil {
		return res, err
	}
	if loadErr != nil && !errors.Is(loadErr, context.DeadlineExceeded) {
		return res, loadErr
	}
	if editErr != nil {
		return res, editErr
	}
	slices.Sort(res.edits)
	if with {
		// The held post's carried delta is applied with the flush that
		// follows the release.
		for range 2 {
			if err := c.caughtUp(ctx, 2*time.Minute); err != nil {
				return res, err
			}
		}
		if err := c.verify(ctx); err != nil && !errors.Is(err, errMismatch) {
			return res, err
		} else {
			res.exact = err == nil
		}
	}
	return res, nil
}

// appSection writes section 8.
func (r *results) appSection(b *strings.Builder) {
	fmt.Fprintf(b, "## 8. The app's side\n\n")
	fmt.Fprintf(b, "%d posts, likes at %d/s to random posts; one transaction holds post %d's row (`SELECT … FOR UPDATE`) for the whole window. "+
		"One app client updates the title of random other posts, one row a statement (latency below); another updates posts %d and %d, "+
		"in random order, in one transaction with %s between the two updates (40P01 below: deadlocks returned to the app).\n\n",
		appPosts, appLikeRate, appHeldPost, appPairA, appPairB, appThink)
	fmt.Fprintf(b, "| | title updates | p50 | p99 | max | two-post transactions | 40P01 | other errors | likes | exact after release |\n")
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, a := range r.app {
		name, exact := "without walcount", "n/a"
		if a.walcount {
			name, exact = "with walcount", "no"
			if a.exact {
				exact = "yes"
			}
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %d | %d | %d | %d | %s |\n", name, len(a.edits),
			msec(a.edit(0.5)), msec(a.edit(0.99)), msec(a.edit(1)), a.pairs, a.deadlocks, a.otherErrs, a.likes, exact)
	}
	b.WriteString("\n")
}

// msec renders a latency in milliseconds with one decimal.
func msec(d time.Duration) string { return fmt.Sprintf("%.1f ms", d.Seconds()*1000) }
