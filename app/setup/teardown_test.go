package setup_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// identities returns relation → relreplident (with the index of 'i').
func (f *fixture) identities(t *testing.T) map[string]string {
	t.Helper()
	rows, err := f.conn.Query(context.Background(), `
SELECT c.relname::text, c.relreplident::text || coalesce(' ' || (SELECT ic.relname::text FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
                                                             WHERE i.indrelid = c.oid AND i.indisreplident), '')
FROM pg_class c WHERE c.relname IN ('likes', 'comments') AND c.relkind = 'r'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, ident string
		if err := rows.Scan(&name, &ident); err != nil {
			t.Fatal(err)
		}
		out[name] = ident
	}
	return out
}

// TestTeardownRestoresReplicaIdentity: setup records the identity each
// table had before it set FULL (DEFAULT for likes, USING INDEX for
// comments); teardown without --restore-replica-identity prints the
// statements that give it back, which run literally; with it, teardown
// restores them itself (its role owns the tables).
func TestTeardownRestoresReplicaIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, restore := range []bool{false, true} {
		f := newFixture(t, testenv.Database(t))
		f.exec(t, `CREATE UNIQUE INDEX comments_id ON comments (id); ALTER TABLE comments REPLICA IDENTITY USING INDEX comments_id`)
		before := f.identities(t)
		res := f.run(t, f.opts(likes, comments))
		if len(res.FixedIdentityTable) != 2 {
			t.Fatalf("setup fixed %v, want likes and comments", res.FixedIdentityTable)
		}
		if got := f.identities(t); got["likes"] != "f" || got["comments"] != "f" {
			t.Fatalf("identities after setup = %v, want FULL", got)
		}
		tres, err := setup.TeardownWith(ctx, f.conn, nil, setup.TeardownOptions{Slot: f.slot, Publication: "walcount",
			Counters: []counter.Counter{likes, comments}, RestoreIdentity: restore})
		if err != nil {
			t.Fatalf("teardown: %v", err)
		}
		var restoreSQL []string
		var said []string
		for _, k := range tres.Kept {
			said = append(said, k.What)
			for _, stmt := range k.SQL {
				if strings.Contains(stmt, "REPLICA IDENTITY") {
					restoreSQL = append(restoreSQL, stmt)
				}
			}
		}
		if restore {
			if len(tres.Restored) != 2 || len(restoreSQL) != 0 {
				t.Errorf("teardown --restore-replica-identity restored %v and left %v", tres.Restored, restoreSQL)
			}
		} else {
			if len(tres.Restored) != 0 || len(restoreSQL) != 2 {
				t.Fatalf("teardown restored %v and printed %v; want nothing restored and two statements", tres.Restored, restoreSQL)
			}
			for _, stmt := range restoreSQL {
				f.exec(t, stmt)
			}
		}
		if got := f.identities(t); got["likes"] != before["likes"] || got["comments"] != before["comments"] {
			t.Errorf("identities after teardown (restore %v) = %v, want %v as before setup", restore, got, before)
		}
		joined := strings.Join(said, "\n")
		for _, want := range []string{"column \"public\".\"posts\".\"likes_count\"", "superuser"} {
			if !strings.Contains(joined, want) {
				t.Errorf("teardown's list of what stays lacks %q:\n%s", want, joined)
			}
		}
	}
}

// TestTeardownAsWalcountsRole runs teardown as walcount's own role after
// the least-privilege install (the owner ran setup --print-sql with the
// replica identity fix): it drops what it made, and prints, for whoever
// may run them, the statement that gives the owner's table its identity
// back and the REVOKE and DROP ROLE statements. Run literally by the
// owner and then by a superuser, they leave neither the identity, nor a
// privilege, nor the role.
func TestTeardownAsWalcountsRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newThreeRoles(t)
	cfg := r.config(t)
	wconn := r.walcountConn(t)
	var out strings.Builder
	if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg, PrintSQL: true, Out: &out, FixReplicaIdentity: true}); err != nil {
		t.Fatalf("setup --print-sql: %v", err)
	}
	r.psql(t, out.String())
	if _, err := setup.Run(ctx, wconn, setup.Options{Config: cfg}); err != nil {
		t.Fatalf("setup as walcount's role: %v", err)
	}
	if got := query(t, r.super, "SELECT relreplident::text FROM pg_class WHERE oid = 'public.likes'::regclass"); got != "f" {
		t.Fatalf("likes' identity after setup = %s, want f", got)
	}

	res, err := setup.TeardownWith(ctx, wconn, nil, setup.TeardownOptions{Slot: cfg.Slot, Publication: cfg.Publication,
		Counters: []counter.Counter{counter.Default()}, RestoreIdentity: true})
	if err != nil {
		t.Fatalf("teardown as walcount's role: %v", err)
	}
	if len(res.Restored) != 0 {
		t.Errorf("walcount's role restored %v on tables it does not own", res.Restored)
	}
	var forOwner, forSuper []string
	for _, k := range res.Kept {
		switch {
		case strings.Contains(k.What, "REPLICA IDENTITY"):
			forOwner = append(forOwner, k.SQL...)
		case strings.Contains(k.What, "privileges granted"), strings.Contains(k.What, "walcount's role"):
			forSuper = append(forSuper, k.SQL...)
		}
	}
	t.Logf("for the owner: %v\nfor a superuser: %v", forOwner, forSuper)
	if len(forOwner) != 1 || !strings.Contains(forOwner[0], "REPLICA IDENTITY DEFAULT") {
		t.Fatalf("teardown printed %v for the tables' owner, want the statement restoring likes' identity", forOwner)
	}
	if len(forSuper) < 2 || !strings.Contains(strings.Join(forSuper, "\n"), "DROP ROLE") {
		t.Fatalf("teardown printed %v, want REVOKE and DROP ROLE statements", forSuper)
	}
	r.psql(t, strings.Join(forOwner, "\n"))
	if got := query(t, r.super, "SELECT relreplident::text FROM pg_class WHERE oid = 'public.likes'::regclass"); got != "d" {
		t.Errorf("likes' identity after the owner ran the printed statement = %s, want d (as before setup)", got)
	}
	superURL := r.super.Config().ConnString()
	cmd := exec.Command(psqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-d", superURL, "-c", strings.Join(forSuper, "\n"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the printed REVOKE and DROP ROLE statements, run as a superuser: %v\n%s", err, b)
	}
	if n := query(t, r.super, "SELECT count(*)::text FROM pg_roles WHERE rolname = $1", r.walcnt); n != "0" {
		t.Errorf("walcount's role %s still exists", r.walcnt)
	}
}
