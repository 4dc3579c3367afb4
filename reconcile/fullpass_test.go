package reconcile_test

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/reconcile"
)

var likesSchema = appschema.SQL(appschema.Options{Index: true})

// driftOf returns the run's drifted keys and their corrections.
func driftOf(run reconcile.RunInfo) map[string]int64 {
	out := map[string]int64{}
	for _, d := range run.Drift {
		out[d.Key] = d.Correction
	}
	return out
}

// TestFullPassUnderLoadCorrectsExactlyTheDrift: a table whose rows
// predate walcount is backfilled, every key off; then, while clients keep
// writing likes, drift is put on keys at the boundaries of the pass's
// ranges, on keys without likes, on keys the clients write to all along
// and on one key of every range. One full pass corrects exactly those
// keys, by exactly their drift, and nothing else.
func TestFullPassUnderLoadCorrectsExactlyTheDrift(t *testing.T) {
	t.Parallel()
	const posts, batch = 3000, 100
	e := newEnv(t, likesSchema+`
INSERT INTO posts (id) SELECT g FROM generate_series(1, 3000) g;
-- Posts 2991 to 3000 have no likes.
INSERT INTO likes (post_id) SELECT 1 + (g * 7919) % 2990 FROM generate_series(1, 15000) g;`, nil, nil)

	backfill := e.waitIdle()
	if backfill.Kind != "backfill" || backfill.KeysChecked != posts || backfill.Drifted != 2990 || backfill.Corrected != 2990 {
		t.Fatalf("backfill = %+v; want every post with likes corrected", backfill)
	}
	e.caughtUp()
	e.assertNone("posts", `SELECT p.id, p.likes_count, count(l.id) FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id HAVING p.likes_count <> count(l.id)`)

	hot := []int64{1, 100, 101, 1500, 3000}
	l := startLoad(e, 3, 2990, hot)
	defer l.stop(t)
	// drift is added to the column: the correction is its opposite.
	drift := map[int64]int64{
		1: 3, 100: -2, 101: 1, 1500: 4, // hot, 100 and 101 at a range's end and the next one's start
		200: 4, 201: -1, 2999: 2, 2995: 5, 3000: -1, // boundaries; 2995, 2999 and 3000 had no likes
	}
	for r := range int64(posts / batch) {
		k := r*batch + 1 + (r*37)%batch
		if _, ok := drift[k]; !ok {
			drift[k] = r%5 - 2
			if drift[k] == 0 {
				drift[k] = 7
			}
		}
	}
	keys := slices.Collect(maps.Keys(drift))
	deltas := make([]int64, len(keys))
	want := map[string]int64{}
	for i, k := range keys {
		deltas[i] = drift[k]
		want[strconv.FormatInt(k, 10)] = -drift[k]
	}
	e.exec(`UPDATE posts p SET likes_count = p.likes_count + d.delta FROM unnest($1::bigint[], $2::bigint[]) AS d(id, delta) WHERE p.id = d.id`, keys, deltas)

	before := e.corrections()
	got := e.reconcile(reconcile.Request{BatchSize: batch})
	if got.KeysChecked != posts || got.Drifted != int64(len(want)) || got.Corrected != int64(len(want)) {
		t.Errorf("run: %d keys checked, %d drifted, %d corrected; want %d, %d, %d", got.KeysChecked, got.Drifted, got.Corrected, posts, len(want), len(want))
	}
	if !maps.Equal(driftOf(got), want) {
		t.Errorf("corrected %v\nwant      %v", driftOf(got), want)
	}
	if n := e.corrections() - before; n != float64(len(want)) {
		t.Errorf("walcount_reconcile_corrections_total grew by %v, want %d", n, len(want))
	}
	l.stop(t)
	e.caughtUp()
	e.assertNone("posts", `SELECT p.id, p.likes_count, count(l.id) FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id HAVING p.likes_count <> count(l.id)`)
}

func (e *env) corrections() float64 {
	var sum float64
	for _, c := range e.cfg.Counters {
		sum += counterValue(e.m.ReconcileCorrections.WithLabelValues(c.Name))
	}
	return sum
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// TestSurveyKeyLayouts: the range survey finds drift in every range, at
// the first and the last key, for integer keys that are sparse, for keys
// of two integer widths, for text keys (ranges in the key's collation)
// and for a sum with a filter.
func TestSurveyKeyLayouts(t *testing.T) {
	t.Parallel()
	type layout struct {
		name, ddl string
		counters  []counter.Counter
		drift     string // SQL that puts drift on three keys
		want      []string
		keys      int64
		check     string // SQL listing what is off
	}
	countCheck := `SELECT p.id, p.likes_count, count(l.id) FROM posts p LEFT JOIN likes l ON l.post_id = p.id
GROUP BY p.id HAVING p.likes_count <> count(l.id)`
	layouts := []layout{{
		name: "sparse bigint keys",
		ddl: likesSchema + `
INSERT INTO posts (id) SELECT g * 1000 FROM generate_series(1, 60) g;
INSERT INTO likes (post_id) SELECT 1000 * (1 + g % 60) FROM generate_series(1, 300) g;`,
		drift: `UPDATE posts SET likes_count = likes_count + 1 WHERE id IN (1000, 31000, 60000)`,
		want:  []string{"1000", "31000", "60000"}, keys: 60, check: countCheck,
	}, {
		name: "integer source key, bigint target key",
		ddl: likesSchema + `
ALTER TABLE posts ALTER COLUMN likes_count TYPE integer;
ALTER TABLE likes ALTER COLUMN post_id TYPE integer;
INSERT INTO posts (id) SELECT g FROM generate_series(-5, 54) g;
INSERT INTO likes (post_id) SELECT -5 + g % 60 FROM generate_series(1, 300) g;`,
		drift: `UPDATE posts SET likes_count = likes_count - 2 WHERE id IN (-5, 7, 54)`,
		want:  []string{"-5", "7", "54"}, keys: 60, check: countCheck,
	}, {
		name: "text keys",
		ddl: appschema.SQL(appschema.Options{KeyType: "text", Index: true}) + `
INSERT INTO posts (id) SELECT unnest(ARRAY['', 'a', 'B', 'with space', 'with:colon', 'ünïcödé', 'quote''s', '10', '9', 'zz'])
  UNION ALL SELECT 'slug-' || g FROM generate_series(1, 40) g;
INSERT INTO likes (post_id) SELECT id FROM posts, generate_series(1, 3);`,
		drift: `UPDATE posts SET likes_count = likes_count + 3 WHERE id IN ('', 'ünïcödé', 'slug-17')`,
		want:  []string{"", "ünïcödé", "slug-17"}, keys: 50, check: countCheck,
	}, {
		name: "sum with a filter",
		ddl: appschema.SQL(appschema.Options{PostsColumns: "weight numeric(14,2) NOT NULL DEFAULT 0",
			LikesColumns: "weight numeric(12,2), deleted_at timestamptz", Index: true, Posts: 40}) + `
INSERT INTO likes (post_id, weight, deleted_at) SELECT 1 + g % 40, (g % 7) * 1.25, CASE WHEN g % 5 = 0 THEN now() END
  FROM generate_series(1, 400) g;`,
		counters: []counter.Counter{{Name: "post_weight", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id",
			Column: "weight", Sum: "weight", Where: map[string]*string{"deleted_at": nil}}},
		drift: `UPDATE posts SET weight = weight + 0.01 WHERE id IN (1, 20, 40)`,
		want:  []string{"1", "20", "40"}, keys: 40,
		check: `SELECT p.id, p.weight, coalesce(sum(l.weight) FILTER (WHERE l.deleted_at IS NULL), 0) FROM posts p
LEFT JOIN likes l ON l.post_id = p.id GROUP BY p.id HAVING p.weight <> coalesce(sum(l.weight) FILTER (WHERE l.deleted_at IS NULL), 0)`,
	}}
	for _, lt := range layouts {
		t.Run(lt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, lt.ddl, nil, func(cfg *config.Config) {
				if lt.counters != nil {
					cfg.Counters = lt.counters
				}
			})
			if b := e.waitIdle(); b.Status != "done" || b.KeysChecked != lt.keys {
				t.Fatalf("backfill = %+v", b)
			}
			e.caughtUp()
			e.assertNone("keys", lt.check)
			e.exec(lt.drift)
			// Batches of 7 keys: many ranges, the drifted keys at
			// different places in theirs.
			got := e.reconcile(reconcile.Request{BatchSize: 7})
			keys := slices.Sorted(maps.Keys(driftOf(got)))
			if got.KeysChecked != lt.keys || got.Corrected != 3 || !slices.Equal(keys, slices.Sorted(slices.Values(lt.want))) {
				t.Fatalf("run: %d keys checked, %d corrected, drift %+v; want %d keys and %v", got.KeysChecked, got.Corrected, got.Drift, lt.keys, lt.want)
			}
			e.caughtUp()
			e.assertNone("keys", lt.check)
		})
	}
}

// TestRateLimit: reconcile.max_keys_per_second paces the daemon's runs:
// no measurement reads more keys than a second's worth, and a run of 300
// keys at 100 keys/s takes at least 2 s (its first 100 keys at once). A
// request's own limit wins; 0 lifts it; a negative one is refused.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.DebugLevel)
	e := newEnv(t, likesSchema+`
INSERT INTO posts (id) SELECT g FROM generate_series(1, 300) g;
INSERT INTO likes (post_id) SELECT 1 + g % 300 FROM generate_series(1, 900) g;`,
		zap.New(core), func(cfg *config.Config) { cfg.Reconcile.MaxKeysPerSecond = 100 })

	// surveys returns the range sizes of the measurements logged since
	// the last call.
	seen := 0
	surveys := func() []int64 {
		var out []int64
		all := logs.FilterMessage("measured").All()
		for _, entry := range all[seen:] {
			if n := entry.ContextMap()["range_keys"].(int64); n > 0 {
				out = append(out, n)
			}
		}
		seen = len(all)
		return out
	}
	sum := func(xs []int64) (s int64) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	surveys() // the backfill's
	start := time.Now()
	run := e.reconcile(reconcile.Request{})
	took := time.Since(start)
	ranges := surveys()
	if run.KeysChecked != 300 || sum(ranges) != 300 {
		t.Fatalf("run checked %d keys in ranges %v, want 300", run.KeysChecked, ranges)
	}
	for _, n := range ranges {
		if n > 100 {
			t.Errorf("a measurement read %d keys; the limit is 100 keys/s", n)
		}
	}
	if took < 2*time.Second {
		t.Errorf("300 keys at 100 keys/s took %s, less than 2s", took)
	}

	unlimited := 0
	e.reconcile(reconcile.Request{MaxKeysPerSecond: &unlimited})
	if ranges := surveys(); !slices.Equal(ranges, []int64{300}) {
		t.Errorf("without a limit, ranges %v; want one of 300 keys", ranges)
	}
	negative := -1
	if _, code := e.start(reconcile.Request{MaxKeysPerSecond: &negative}); code != 400 {
		t.Errorf("a negative limit: HTTP %d, want 400", code)
	}
}
