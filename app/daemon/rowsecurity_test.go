package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// rlsSchema is schema with likes that already have rows, counted exactly
// by the app before walcount came, of several users, and a tenant policy
// on likes as a multi-tenant app writes it.
var rlsSchema = schema + `
INSERT INTO likes (post_id, user_id) SELECT 1 + g % 20, 1 + g % 7 FROM generate_series(1, 110) g;
UPDATE posts p SET likes_count = (SELECT count(*) FROM likes l WHERE l.post_id = p.id);
ALTER TABLE likes ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON likes USING (user_id = current_setting('app.user_id', true)::bigint);
`

// asRole makes e's daemon connect as a role created with LOGIN and
// REPLICATION only, with the grants walcount check asks for; with owner,
// the role owns likes (and needs no grant on it).
func (e *env) asRole(t *testing.T, role string, owner bool) {
	t.Helper()
	e.exec("CREATE ROLE " + role + " LOGIN REPLICATION")
	if owner {
		e.exec("ALTER TABLE likes OWNER TO " + role)
	} else {
		e.exec("GRANT SELECT ON likes TO " + role)
	}
	e.exec("GRANT SELECT (id, likes_count), UPDATE (likes_count) ON posts TO " + role)
	e.exec("GRANT USAGE ON SCHEMA walcount TO " + role)
	e.exec("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO " + role)
	e.exec("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO " + role)
	u, err := url.Parse(e.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	e.cfg.DatabaseURL = u.String()
}

// TestRowSecurityHidesRows: walcount's role does not bypass a tenant
// policy on likes, so COUNT(*) sees no like at all. The backfill at the
// first start must refuse rather than "correct" every post to 0; the
// stream, which carries every row whatever the policies, keeps the counts
// exact; a dirty mark is not repaired (it stays, and is listed) until the
// role can see every row; after the fix, the repair finds nothing to
// correct. Once with a role that is granted SELECT, once with FORCE ROW
// LEVEL SECURITY on a table the role owns.
func TestRowSecurityHidesRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		owner bool
		fix   string
	}{
		{"granted", false, "CREATE POLICY walcount_all ON likes FOR SELECT TO walcount_rls USING (true)"},
		{"owner with FORCE", true, "ALTER ROLE walcount_rls BYPASSRLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvWith(t, rlsSchema, nil)
			e.asRole(t, "walcount_rls", tc.owner)
			if tc.owner {
				e.exec("ALTER TABLE likes FORCE ROW LEVEL SECURITY")
			}
			ctx := context.Background()
			core, logs := observer.New(zapcore.WarnLevel)
			d := e.start(func(o *Options) { o.Logger = zap.New(zapcore.NewTee(core, testLogger(t).Core())) })

			// The backfill refuses, with the reason, and writes nothing.
			run := waitRun(t, d, 0)
			if run.Kind != state.KindBackfill || run.Status != state.StatusFailed || !strings.Contains(run.Error, "row-level security") {
				t.Errorf("backfill = %s %s (%q), want it failed because of row-level security", run.Kind, run.Status, run.Error)
			}
			if run.Corrected != 0 {
				t.Errorf("the backfill corrected %d keys", run.Corrected)
			}
			e.waitCaughtUp(catchUp)
			e.assertExact()

			// The stream keeps the counts exact.
			newWorkload(e.db).run(ctx, 2, 50)
			e.waitCaughtUp(catchUp)
			e.assertExact()

			// A dirty counter is not repaired while the policy hides rows.
			if err := state.MarkDirty(ctx, e.db, e.cfg.Slot, "post_likes", nil, "test: a cause"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the warning that the dirty counter is not repaired", func() bool {
				return logs.FilterMessageSnippet("a dirty counter is not repaired").Len() > 0
			})
			var repairs int
			if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty'").Scan(&repairs); err != nil {
				t.Fatal(err)
			}
			if repairs != 0 {
				t.Errorf("%d repairs of a counter whose rows walcount cannot see", repairs)
			}
			if st := d.d.Status(ctx); len(st.Dirty) != 1 {
				t.Errorf("/status lists dirty marks %+v, want the one left", st.Dirty)
			}
			e.assertExact()

			// Once the role sees every row, the repair and the backfill
			// run by themselves, find nothing to correct, and the counts
			// stay exact.
			e.exec(tc.fix)
			newWorkload(e.db).run(ctx, 2, 50)
			e.waitClean(t, 2*time.Minute)
			waitFor(t, "the backfill queued again and done", func() bool {
				var done int
				_ = e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'backfill' AND status = 'done'").Scan(&done)
				return done == 1
			})
			var corrected int64
			if err := e.db.QueryRow(ctx, "SELECT coalesce(sum(corrected), 0) FROM walcount.reconcile_runs").Scan(&corrected); err != nil {
				t.Fatal(err)
			}
			if corrected != 0 {
				t.Errorf("%d corrections of counts that were exact", corrected)
			}
			e.assertExact()
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRowSecurityEnabledDuringReconcile: a policy enabled on likes while a
// paced full reconciliation walks the posts. Every measurement after it
// must refuse, so the run fails with the reason and corrects nothing from
// the partial view (which would set every post it reaches to 0), not even
// the drift it had not reached yet.
func TestRowSecurityEnabledDuringReconcile(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, schema+`
INSERT INTO likes (post_id, user_id) SELECT 1 + g % 50, 1 + g % 7 FROM generate_series(1, 300) g;
UPDATE posts p SET likes_count = (SELECT count(*) FROM likes l WHERE l.post_id = p.id);
`, nil)
	e.asRole(t, "walcount_rls", false)
	d := e.start()
	if run := waitRun(t, d, 0); run.Status != state.StatusDone {
		t.Fatalf("backfill %s: %s", run.Status, run.Error)
	}
	e.exec("UPDATE posts SET likes_count = likes_count + 7 WHERE id = 50")
	rate := 10
	run := startRun(t, d, reconcile.Request{BatchSize: 5, MaxKeysPerSecond: &rate})
	waitFor(t, "the run under way", func() bool {
		cur := d.d.ReconcileStatus().Current
		return cur != nil && cur.ID == run.ID && cur.KeysChecked > 0
	})
	e.exec("ALTER TABLE likes ENABLE ROW LEVEL SECURITY")
	e.exec("CREATE POLICY tenant ON likes USING (user_id = current_setting('app.user_id', true)::bigint)")
	got := waitRun(t, d, run.ID)
	if got.Status != state.StatusFailed || !strings.Contains(got.Error, "row-level security") {
		t.Fatalf("run %s (%q) after row-level security was enabled midway, want it failed because of it", got.Status, got.Error)
	}
	if got.KeysChecked >= 50 {
		t.Fatalf("the run checked all %d keys before the policy came: the test shows nothing", got.KeysChecked)
	}
	if got.Corrected != 0 {
		t.Errorf("the run corrected %d keys", got.Corrected)
	}
	e.waitCaughtUp(catchUp)
	if cached, truth := e.count(t, 50); cached != truth+7 {
		t.Errorf("post 50: likes_count %d, want the drift left as it was (%d)", cached, truth+7)
	}
	e.exec("UPDATE posts SET likes_count = likes_count - 7 WHERE id = 50")
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestRowSecurityOnTargetStops: a policy lets walcount's role see only
// some posts. The flush would take a hidden post for a deleted one and
// drop its likes; the daemon refuses to stream instead, naming the fix,
// and the counts stay as they were.
func TestRowSecurityOnTargetStops(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, schema, nil)
	e.asRole(t, "walcount_rls", false)
	e.exec("ALTER TABLE posts ENABLE ROW LEVEL SECURITY")
	e.exec("CREATE POLICY firsthalf ON posts USING (id <= 25)")
	e.exec("INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g")
	d := e.start()
	err := d.wait(t, time.Minute)
	if !errors.Is(err, counter.ErrPartialView) || !strings.Contains(err.Error(), "CREATE POLICY walcount_all ON public.posts FOR ALL TO walcount_rls USING (true) WITH CHECK (true);") {
		t.Fatalf("Run = %v, want it stopped by the policy on posts, with the fix", err)
	}
	var counted int64
	if err := e.db.QueryRow(context.Background(), "SELECT sum(likes_count) FROM posts").Scan(&counted); err != nil {
		t.Fatal(err)
	}
	if counted != 0 {
		t.Errorf("%d likes counted by a daemon that should not have flushed", counted)
	}
}

// TestRowSecurityEnabledWhileReading: ENABLE ROW LEVEL SECURITY on likes
// (no policy: walcount's role then sees no like at all) commits while a
// reconcile's read waits for the lock the ALTER TABLE holds. The check in
// the measurement's transaction came first and saw no policy apply; the
// read, which sees the table as the committed ALTER left it, must fail
// (row_security = off) rather than count through it.
func TestRowSecurityEnabledWhileReading(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, schema+`
INSERT INTO likes (post_id, user_id) SELECT 1 + g % 20, 1 + g % 7 FROM generate_series(1, 110) g;
UPDATE posts p SET likes_count = (SELECT count(*) FROM likes l WHERE l.post_id = p.id);
`, nil)
	e.asRole(t, "walcount_rls", false)
	ctx := context.Background()
	d := e.start()
	if run := waitRun(t, d, 0); run.Status != state.StatusDone || run.Corrected != 0 {
		t.Fatalf("backfill %s, %d corrected (%s)", run.Status, run.Corrected, run.Error)
	}
	ddl, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ddl.Rollback(ctx) //nolint:errcheck // no-op after commit
	if _, err := ddl.Exec(ctx, "ALTER TABLE likes ENABLE ROW LEVEL SECURITY"); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, d, reconcile.Request{})
	waitFor(t, "the reconcile's read waiting for the lock on likes", func() bool {
		var waiting bool
		_ = e.db.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE relation = 'likes'::regclass AND NOT granted)").Scan(&waiting)
		return waiting
	})
	if err := ddl.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := waitRun(t, d, run.ID)
	// What waited for the lock may be the read itself (it then fails
	// under row_security = off) or the check before it (seen on
	// PostgreSQL 18): either refuses the partial view.
	if got.Status != state.StatusFailed || !(strings.Contains(got.Error, "query would be affected by row-level security policy") ||
		strings.Contains(got.Error, "row-level security hides rows")) {
		t.Fatalf("run %s (%q), want it failed: the read under row_security = off, or the check, refusing a partial view", got.Status, got.Error)
	}
	if got.Corrected != 0 {
		t.Errorf("the run corrected %d keys", got.Corrected)
	}
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestRowSecurityEnabledOnTargetWhileRunning: a policy that lets
// walcount's role see only some posts is enabled while the daemon
// streams. Before, nothing noticed it until the next session's start, and
// meanwhile the flush took every hidden post for a deleted one and dropped
// its likes. Now the daemon notices at once, without a restart: the next
// flush that meets a hidden row fails instead of dropping it (the flush
// runs with row_security = off), and the periodic check stops the daemon
// with the fix, as at a start. Nothing is lost: once the policy lets the
// role see every post, a new daemon applies every like.
func TestRowSecurityEnabledOnTargetWhileRunning(t *testing.T) {
	t.Parallel()
	// With likes after the policy, the flush meets it first; without,
	// only the periodic check can.
	for _, likes := range []bool{true, false} {
		t.Run(fmt.Sprintf("likes=%v", likes), func(t *testing.T) {
			t.Parallel()
			e := newEnvWith(t, schema, nil)
			e.asRole(t, "walcount_rls", false)
			d := e.start()
			e.exec("INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g")
			e.waitCaughtUp(catchUp)
			e.assertExact()
			e.exec("ALTER TABLE posts ENABLE ROW LEVEL SECURITY")
			e.exec("CREATE POLICY firsthalf ON posts USING (id <= 25)")
			if likes {
				e.exec("INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g")
			}
			err := d.wait(t, time.Minute)
			if !errors.Is(err, counter.ErrPartialView) || !strings.Contains(err.Error(), "CREATE POLICY walcount_all ON public.posts FOR ALL TO walcount_rls USING (true) WITH CHECK (true);") {
				t.Fatalf("Run = %v, want it stopped by the policy on posts, with the fix", err)
			}
			e.exec("CREATE POLICY walcount_all ON posts FOR ALL TO walcount_rls USING (true) WITH CHECK (true)")
			d = e.start()
			e.waitCaughtUp(catchUp)
			e.assertExact()
			want := map[bool]int64{true: 4, false: 2}[likes]
			var short int64
			if err := e.db.QueryRow(context.Background(), "SELECT count(*) FROM posts WHERE likes_count <> $1", want).Scan(&short); err != nil || short != 0 {
				t.Errorf("%d posts without their %d likes (%v)", short, want, err)
			}
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}
