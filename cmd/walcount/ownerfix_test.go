package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// publicationFix runs check --json and returns the SQL of the fix of its
// first publication problem: what follows the fix's first line.
func publicationFix(t *testing.T, c *cli, extra ...string) string {
	t.Helper()
	code, out := c.run(append([]string{"check", "--json"}, extra...)...)
	if code == exitOK {
		t.Fatalf("check: exit 0, want a publication problem")
	}
	var rep checkReport
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
		t.Fatalf("check --json: %v\n%s", err, out)
	}
	for _, f := range rep.Findings {
		if f.Check == "publication" && f.Severity == "problem" {
			_, sql, ok := strings.Cut(f.Fix, "\n")
			if !ok || !strings.Contains(f.Fix, "the owner of the tables runs all of these statements") {
				t.Fatalf("the publication's fix holds no statements for the owner: %s", f.Fix)
			}
			return sql
		}
	}
	t.Fatalf("check reports no publication problem:\n%s", out)
	return ""
}

// TestCheckPrintsEveryOwnerStatement: under least privilege (the app's
// tables belong to their owner; walcount's role has REPLICATION and
// nothing else on them), check's fix of the publication is every
// statement the owner runs, and who runs it: on first use walcount's
// state schema (walcount.messages is in the publication; the bare CREATE
// PUBLICATION check printed left it out, and setup refused the
// publication run literally), the grants, the replica identity and the
// publication; for a new counter's table, its grants, its identity and
// the ALTER PUBLICATION. Run literally as the owner, each lets setup (as
// walcount's role) and check pass.
func TestCheckPrintsEveryOwnerStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.Database(t)
	c := newCLI(t, dbURL, appschema.SQL(appschema.Options{DefaultIdentity: true})+`
CREATE TABLE users (id bigint PRIMARY KEY, comments_count bigint NOT NULL DEFAULT 0);
CREATE TABLE comments (id bigserial PRIMARY KEY, user_id bigint NOT NULL);`)
	n := slotSeq.Add(1)
	owner, role := fmt.Sprintf("fix_owner_%d_%d", os.Getpid(), n), fmt.Sprintf("fix_walcount_%d_%d", os.Getpid(), n)
	var db string
	if err := c.conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	dbID := pgx.Identifier{db}.Sanitize()
	for _, sql := range []string{
		"CREATE ROLE " + owner + " LOGIN", "CREATE ROLE " + role + " LOGIN REPLICATION",
		"GRANT CREATE ON DATABASE " + dbID + " TO " + owner + ", " + role, "GRANT " + role + " TO " + owner,
		"ALTER TABLE likes OWNER TO " + owner, "ALTER TABLE posts OWNER TO " + owner,
		"ALTER TABLE users OWNER TO " + owner, "ALTER TABLE comments OWNER TO " + owner,
	} {
		if _, err := c.conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = c.conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", c.slot)
		for _, r := range []string{role, owner} {
			_, _ = c.conn.Exec(context.Background(), "DROP OWNED BY "+r+" CASCADE")
		}
		for _, r := range []string{role, owner} {
			_, _ = c.conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
		}
	})
	ownerConn, err := pgx.Connect(ctx, strings.Replace(dbURL, "postgres@", owner+"@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer ownerConn.Close(ctx)
	c.db = strings.Replace(dbURL, "postgres@", role+"@", 1)
	asOwner := func(sql string) {
		t.Helper()
		if _, err := ownerConn.Exec(ctx, sql); err != nil {
			t.Fatalf("the owner runs check's fix literally: %v\n%s", err, sql)
		}
	}

	// First use.
	sql := publicationFix(t, c)
	for _, want := range []string{"walcount.messages", "GRANT SELECT ON", "REPLICA IDENTITY FULL", "CREATE PUBLICATION"} {
		if !strings.Contains(sql, want) {
			t.Errorf("check's fix on first use lacks %q:\n%s", want, sql)
		}
	}
	asOwner(sql)
	if code, out := c.run("setup"); code != exitOK {
		t.Fatalf("setup as walcount's role after the owner ran check's fix: exit %d\n%s", code, out)
	}
	if code, out := c.run("check"); code != exitOK {
		t.Fatalf("check after setup: exit %d\n%s", code, out)
	}

	// A new counter on another table.
	cfg := c.writeConfig(`counters:
  - {name: post_likes, source: public.likes, key: post_id, target: public.posts, target_key: id, column: likes_count}
  - {name: user_comments, source: public.comments, key: user_id, target: public.users, target_key: id, column: comments_count}
`)
	sql = publicationFix(t, c, "--config", cfg)
	for _, want := range []string{`"public"."comments"`, "GRANT SELECT ON \"public\".\"comments\"", "ALTER TABLE \"public\".\"comments\" REPLICA IDENTITY FULL", "ALTER PUBLICATION"} {
		if !strings.Contains(sql, want) {
			t.Errorf("check's fix for a new counter lacks %q:\n%s", want, sql)
		}
	}
	asOwner(sql)
	if code, out := c.run("setup", "--config", cfg); code != exitOK {
		t.Fatalf("setup as walcount's role after the owner ran the fix for the new counter: exit %d\n%s", code, out)
	}
	if code, out := c.run("check", "--config", cfg); code != exitOK {
		t.Fatalf("check with the new counter after setup: exit %d\n%s", code, out)
	}
}
