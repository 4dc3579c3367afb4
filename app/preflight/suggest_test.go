package preflight_test

import (
	"testing"

	"github.com/walcount/walcount/app/preflight"
)

// TestMisspeltCounterColumn: a typo in a counter's target column
// (like_count for likes_count) used to get only the fix `ADD COLUMN
// like_count`; the finding now names the nearest existing column, and the
// fix offers the configuration's change first. A name with no near column
// keeps the plain fix.
func TestMisspeltCounterColumn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, goodSchema)
	cfg := f.cfg
	cfg.Counters[0].Column = "like_count"
	findings := run(t, cfg)
	fd := want(t, findings, preflight.CheckColumn, preflight.Problem, "counter column public.posts.like_count does not exist (did you mean likes_count?)")
	wantFix(t, fd, "set counters[0].column in the config file to likes_count if that is the column meant; else ALTER TABLE public.posts ADD COLUMN like_count bigint NOT NULL DEFAULT 0; then walcount reconcile")

	cfg.Counters[0].Column = "shares_total"
	fd = want(t, run(t, cfg), preflight.CheckColumn, preflight.Problem, "counter column public.posts.shares_total does not exist")
	wantFix(t, fd, "ALTER TABLE public.posts ADD COLUMN shares_total bigint NOT NULL DEFAULT 0; then walcount reconcile")
}
