package main

import (
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestUnknownCommandSuggests: a misspelt command is a usage error that
// names the command meant, as cobra suggests ("did you mean"), which the
// root's own argument check had lost.
func TestUnknownCommandSuggests(t *testing.T) {
	t.Parallel()
	for typo, want := range map[string]string{"stauts": "status", "recocile": "reconcile", "setpu": "setup"} {
		code, out := execute(t, typo)
		if code != exitUsage || !strings.Contains(out, "Did you mean this?") || !strings.Contains(out, "\t"+want+"\n") {
			t.Errorf("walcount %s: exit %d, want %d suggesting %q:\n%s", typo, code, exitUsage, want, out)
		}
	}
	if code, out := execute(t, "zzzzzz"); code != exitUsage || strings.Contains(out, "Did you mean") {
		t.Errorf("walcount zzzzzz: exit %d, want %d and no suggestion:\n%s", code, exitUsage, out)
	}
}

// TestTeardownHelpSaysItPreviews: teardown --help says that without --yes
// it drops nothing and only lists what it would drop.
func TestTeardownHelpSaysItPreviews(t *testing.T) {
	t.Parallel()
	code, out := execute(t, "teardown", "--help")
	if code != exitOK || !strings.Contains(out, "Without --yes it only lists what it would drop") {
		t.Errorf("teardown --help: exit %d, want it to say that without --yes it only previews:\n%s", code, out)
	}
}

// TestSumOverTextIsAConfigProblem: a counter summing a text column is a
// problem only the configuration fixes: check and run exit 2 (1 before)
// and the finding says what to set (it had no fix).
func TestSumOverTextIsAConfigProblem(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), `
CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, note text, amount numeric(12,2) NOT NULL DEFAULT 0);
CREATE INDEX ON orders (user_id);
ALTER TABLE orders REPLICA IDENTITY FULL;
CREATE TABLE users (id bigint PRIMARY KEY, spent numeric(14,2) NOT NULL DEFAULT 0);`)
	path := c.writeConfig("counters:\n  - {name: spent, source: orders, key: user_id, target: users, target_key: id, column: spent, sum: note}\n")
	code, out := c.run("check", "--config", path)
	if code != exitUsage {
		t.Errorf("check: exit %d, want %d", code, exitUsage)
	}
	want := "summed column public.orders.note is text: it must be smallint, integer, bigint, numeric or boolean — fix: set counters[0].sum in " + path +
		" to a smallint, integer, bigint, numeric or boolean column of public.orders (amount, id, user_id), or remove sum to count rows"
	if !strings.Contains(out, want) {
		t.Errorf("check does not say %q", want)
	}
}
