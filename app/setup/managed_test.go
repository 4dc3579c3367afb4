package setup_test

import (
	"context"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestManagedDatabasesEmulated: what can be emulated of the managed
// providers on a plain PostgreSQL. A role named rds_replication granting
// membership is recognised as RDS's replication capability, and said to
// be no more than a name elsewhere (here the replication connection indeed
// fails); the providers' switches (rds.logical_replication,
// cloudsql.logical_decoding) are custom settings here, read as the real
// ones would be; a neon.* setting brings Neon's warning about reaped
// slots. It does not verify RDS, Cloud SQL or Neon themselves.
func TestManagedDatabasesEmulated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A cluster of its own: roles are cluster-wide.
	pg := testenv.Postgres(t)
	f := newFixture(t, pg.URL())
	f.exec(t, "ALTER TABLE likes REPLICA IDENTITY FULL")
	f.run(t, f.opts(likes))
	f.exec(t, `CREATE ROLE rds_replication; CREATE ROLE rds_app LOGIN; GRANT rds_replication TO rds_app;
GRANT SELECT ON likes TO rds_app; GRANT SELECT, UPDATE (likes_count) ON posts TO rds_app;
GRANT USAGE ON SCHEMA walcount TO rds_app; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA walcount TO rds_app; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA walcount TO rds_app`)
	cfg := f.opts(likes).Config
	cfg.DatabaseURL = withUser(t, pg.URL(), "rds_app")

	findings := func() []preflight.Finding {
		t.Helper()
		fs, err := preflight.Run(ctx, preflight.Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	find := func(fs []preflight.Finding, check, substr string) *preflight.Finding {
		for i := range fs {
			if fs[i].Check == check && strings.Contains(fs[i].Message, substr) {
				return &fs[i]
			}
		}
		return nil
	}

	fs := findings()
	if f := find(fs, preflight.CheckRole, "member of rds_replication"); f == nil || f.Severity != preflight.OK || !strings.Contains(f.Message, "grants nothing") {
		t.Errorf("role finding of an rds_replication member: %+v", f)
	}
	if f := find(fs, preflight.CheckReplicationConn, ""); f == nil || f.Severity != preflight.Problem {
		t.Errorf("an emulated rds_replication is not RDS: the replication connection must fail here: %+v", f)
	}
	if f := find(fs, preflight.CheckProvider, ""); f != nil {
		t.Errorf("a provider finding on plain PostgreSQL: %+v", f)
	}

	f.exec(t, "ALTER DATABASE postgres SET rds.logical_replication = '0'")
	if f := find(findings(), preflight.CheckProvider, "rds.logical_replication is 0"); f == nil || f.Severity != preflight.Problem || !strings.Contains(f.Fix, "parameter group") {
		t.Errorf("rds.logical_replication off: %+v", f)
	}
	f.exec(t, "ALTER DATABASE postgres SET rds.logical_replication = 'on'")
	if f := find(findings(), preflight.CheckProvider, "rds.logical_replication is on"); f == nil || f.Severity != preflight.OK {
		t.Errorf("rds.logical_replication on: %+v", f)
	}
	f.exec(t, "ALTER DATABASE postgres RESET rds.logical_replication; ALTER DATABASE postgres SET cloudsql.logical_decoding = 'off'")
	if f := find(findings(), preflight.CheckProvider, "cloudsql.logical_decoding is off"); f == nil || f.Severity != preflight.Problem || !strings.Contains(f.Fix, "cloudsql.logical_decoding=on") {
		t.Errorf("cloudsql.logical_decoding off: %+v", f)
	}
	f.exec(t, "ALTER DATABASE postgres RESET cloudsql.logical_decoding; ALTER DATABASE postgres SET neon.tenant_id = 'emulated'")
	if f := find(findings(), preflight.CheckProvider, "Neon"); f == nil || f.Severity != preflight.Warning || !strings.Contains(f.Message, "removes inactive replication slots") {
		t.Errorf("neon: %+v", f)
	}
}
