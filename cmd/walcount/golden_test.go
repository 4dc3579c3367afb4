package main

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"testing"

	"github.com/walcount/walcount/internal/testkit/golden"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestCheckGolden holds what walcount check prints for golden's
// representative configuration (a counter of each kind) to
// testdata/check_fresh.pg<major>.txt before walcount setup (the problems
// setup fixes, and warnings), and testdata/check_set_up.pg<major>.txt
// after walcount setup --fix-replica-identity; then what walcount status
// prints with no daemon, after a write, to testdata/status_set_up.txt
// (TestStatusGolden holds the report's other shapes without servers). Each
// file ends with the exit code. The findings differ between PostgreSQL
// versions, hence a file of check per major version. What varies between runs is replaced by placeholders: the
// server's version, system identifier and address, the database, the
// slot, the Redis address, the config file's directory, LSNs, and how many
// slots and WAL senders the other tests on the shared server use, and
// status's sizes and ages. The
// role is the test servers' superuser, postgres, every time. Run it with
// -update to rewrite the files, and review their diff.
func TestCheckGolden(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), golden.RepresentativeSchema)
	path := c.writeConfig(golden.RepresentativeConfig)
	var version int
	var db string
	if err := c.conn.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int, current_database()::text").Scan(&version, &db); err != nil {
		t.Fatal(err)
	}
	pgURL, err := url.Parse(c.db)
	if err != nil {
		t.Fatal(err)
	}
	redisURL, err := url.Parse(c.redis)
	if err != nil {
		t.Fatal(err)
	}
	norm := golden.Replacer{
		golden.Literal(c.tempDir, "<dir>"),
		golden.Literal(c.slot, "<slot>"),
		golden.Literal(db, "<database>"),
		golden.Literal(pgURL.Host, "<postgres>"),
		golden.Literal(redisURL.Host, "<redis>"),
		{Pattern: regexp.MustCompile(`PostgreSQL [0-9][0-9.]*( \([^)]*\))?`), Placeholder: "PostgreSQL <version>"},
		{Pattern: regexp.MustCompile(`(system )[0-9]+`), Placeholder: "${1}<id>"},
		{Pattern: regexp.MustCompile(`(max_(?:replication_slots|wal_senders) is [0-9]+, )[0-9]+( in use)`), Placeholder: "${1}<n>${2}"},
		{Pattern: regexp.MustCompile(`( <n> in use: )[0-9]+( free)`), Placeholder: "${1}<n>${2}"},
		{Pattern: regexp.MustCompile(`\b[0-9A-F]{1,8}/[0-9A-F]{1,8}\b`), Placeholder: "<lsn>"},
	}
	check := func(name string) {
		t.Helper()
		code, out := c.run("check", "--config", path)
		out += fmt.Sprintf("(exit code %d)\n", code)
		golden.Check(t, fmt.Sprintf("%s.pg%d.txt", name, version/10000), []byte(norm.Apply(out)))
	}
	check("check_fresh")
	if code, out := c.run("setup", "--config", path, "--fix-replica-identity"); code != exitOK {
		t.Fatalf("walcount setup: exit %d\n%s", code, out)
	}
	check("check_set_up")

	// The slot holds back the WAL of this write, so status warns that it
	// holds WAL back whatever the other tests write meanwhile.
	if _, err := c.conn.Exec(context.Background(), "INSERT INTO likes (post_id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	code, out := c.run("status", "--config", path)
	out += fmt.Sprintf("(exit code %d)\n", code)
	status := append(norm,
		golden.Rule{Pattern: regexp.MustCompile(`[0-9]+(\.[0-9])? (B|KiB|MiB|GiB)\b`), Placeholder: "<size>"},
		golden.Rule{Pattern: regexp.MustCompile(`moved [0-9hms.]+ ago`), Placeholder: "moved <age> ago"})
	golden.Check(t, "status_set_up.txt", []byte(status.Apply(out)))
}
