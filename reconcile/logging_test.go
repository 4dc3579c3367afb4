package reconcile_test

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// TestCorrectionLogging: the first-start backfill of 10,000 posts, which
// corrects every one of them, is not drift. At the default level it logs
// a summary, not one WARN line per key (10,000 of them before); the
// per-key lines are at debug. A reconcile of an existing counter that
// finds 10,000 keys off logs per-key WARN lines only up to a rate limit,
// and a summary with the total.
func TestCorrectionLogging(t *testing.T) {
	t.Parallel()
	const posts = 10000
	core, logs := observer.New(zapcore.DebugLevel)
	start := time.Now()
	e := newEnv(t, likesSchema+fmt.Sprintf(`
INSERT INTO posts (id) SELECT g FROM generate_series(1, %[1]d) g;
INSERT INTO likes (post_id) SELECT 1 + g %% %[1]d FROM generate_series(1, %[1]d) g;`, posts),
		zap.New(core), func(cfg *config.Config) { cfg.Reconcile.MaxKeysPerSecond = 0 })
	backfill := e.waitIdle()
	if backfill.Kind != state.KindBackfill || backfill.Corrected != posts {
		t.Fatalf("backfill = %s, %d corrected; want a backfill of %d posts", backfill.Kind, backfill.Corrected, posts)
	}
	visible := func(entries []observer.LoggedEntry) (n int) {
		for _, en := range entries {
			if en.Level >= zapcore.InfoLevel {
				n++
			}
		}
		return n
	}
	all := logs.All()
	t.Logf("first start with a backfill of %d keys: %d log lines at info and above (%s)", posts, visible(all), time.Since(start).Round(time.Millisecond))
	if n := visible(logs.FilterMessage("corrected drift").All()); n != 0 {
		t.Errorf("the backfill logged %d per-key 'corrected drift' lines at info or above; want none", n)
	}
	if n := logs.FilterMessage("corrected drift").FilterLevelExact(zapcore.DebugLevel).Len(); n != posts {
		t.Errorf("%d per-key lines at debug; want one per key, %d", n, posts)
	}
	if n := visible(all); n > 40 {
		t.Errorf("the first start logged %d lines at info or above; want a summary, not a line per key", n)
	}
	sum := logs.FilterMessage("counter backfilled").All()
	if len(sum) != 1 || sum[0].ContextMap()["corrected"] != int64(posts) || sum[0].ContextMap()["counter"] != "post_likes" {
		t.Errorf("backfill summary = %v; want one line with counter post_likes and corrected %d", sum, posts)
	}

	// Drift on every key of an existing counter.
	e.exec(`UPDATE posts SET likes_count = likes_count + 1`)
	seen := logs.Len()
	began := time.Now()
	run := e.reconcile(reconcile.Request{})
	took := time.Since(began)
	if run.Corrected != posts {
		t.Fatalf("reconcile corrected %d keys, want %d", run.Corrected, posts)
	}
	after := logs.All()[seen:]
	warned := 0
	for _, en := range after {
		if en.Message == "corrected drift" && en.Level == zapcore.WarnLevel {
			warned++
		}
	}
	// A burst, then at most one a second.
	if limit := reconcile.DriftLogBurst + int(took/time.Second) + 1; warned == 0 || warned > limit {
		t.Errorf("the reconcile logged %d per-key WARN lines in %s; want between 1 and %d", warned, took, limit)
	}
	var summary []observer.LoggedEntry
	for _, en := range after {
		if en.Message == "counter reconciled" {
			summary = append(summary, en)
		}
	}
	if len(summary) != 1 || summary[0].Level != zapcore.WarnLevel || summary[0].ContextMap()["corrected"] != int64(posts) ||
		summary[0].ContextMap()["not_logged"] != int64(posts-warned) {
		t.Errorf("reconcile summary = %v; want one WARN line with corrected %d, not_logged %d", summary, posts, posts-warned)
	}
	t.Logf("reconcile correcting %d keys: %d per-key lines at warn, %d lines at info and above", posts, warned, visible(after))
}
