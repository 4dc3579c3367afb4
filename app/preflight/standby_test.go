package preflight_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// TestStandbyDecoding points replication_url at a hot standby whose
// hot_standby_feedback is off: check finds the slot there (not "does not
// exist" on the primary) and requires hot_standby_feedback with the fix;
// once it is on, the check passes.
func TestStandbyDecoding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	if pg.Major() < 16 {
		t.Skipf("decoding on a standby needs PostgreSQL 16 or later; WALCOUNT_TEST_PG selects %d", pg.Major())
	}
	standby, err := pg.StartStandby(ctx, servers.StandbyOptions{Settings: map[string]string{"hot_standby_feedback": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	f := fixtureOn(t, pg.URL(), goodSchema)
	f.exec(t, "CREATE PUBLICATION walcount FOR TABLE likes, posts")
	primary, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close(ctx)
	sb, err := pgx.Connect(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	var lsn state.LSN
	if err := slot.Create(ctx, sb, primary, f.cfg.Slot, &lsn); err != nil {
		t.Fatalf("create the slot on the standby: %v", err)
	}
	t.Cleanup(func() { _, _ = sb.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", f.cfg.Slot) })
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	f.createCheckpoint(t, lsn.String())
	f.cfg.ReplicationURL = standby.URL()

	findings := run(t, f.cfg)
	p := want(t, findings, preflight.CheckStandbyDecoding, preflight.Problem, "hot_standby_feedback is off on the standby that holds the slot")
	wantFix(t, p, "on the standby: ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();")
	none(t, findings, preflight.CheckSlot, preflight.Problem)

	exec(sb, "ALTER SYSTEM SET hot_standby_feedback = on")
	exec(sb, "SELECT pg_reload_conf()")
	findings = run(t, f.cfg)
	want(t, findings, preflight.CheckStandbyDecoding, preflight.OK, "hot_standby_feedback is on")
	want(t, findings, preflight.CheckStandbyDecoding, preflight.OK, "replication_url names a hot standby")
	none(t, findings, preflight.CheckStandbyDecoding, preflight.Problem)
	none(t, findings, preflight.CheckSlot, preflight.Problem)
}

// TestSmallerIdentityAdvice: a FULL source with a unique index over NOT
// NULL columns holding every column the counter reads gets the advice of
// REPLICA IDENTITY USING INDEX; one whose unique index has a nullable
// column, or lacks the key, does not.
func TestSmallerIdentityAdvice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, likesColumns string
		advice             bool
	}{
		{"unique (post_id, user_id)", "user_id bigint NOT NULL, UNIQUE (post_id, user_id)", true},
		{"nullable column", "user_id bigint, UNIQUE (post_id, user_id)", false},
		{"only the surrogate key", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, appschema.SQL(appschema.Options{LikesColumns: tc.likesColumns}))
			findings := run(t, f.cfg)
			ok := want(t, findings, preflight.CheckReplicaIdentity, preflight.OK, "replica identity of public.likes is FULL")
			const advice = "ALTER TABLE public.likes REPLICA IDENTITY USING INDEX likes_post_id_user_id_key"
			if got := strings.Contains(ok.Message, advice); got != tc.advice {
				t.Errorf("advice %v, want %v: %s", got, tc.advice, ok.Message)
			}
		})
	}
}
