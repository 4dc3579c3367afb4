package preflight

import (
	"strings"
	"testing"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/counter"
)

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"post_id", "post_id", 0}, {"post_idd", "post_id", 1}, {"postid", "post_id", 1},
		{"psot_id", "post_id", 2}, {"kitten", "sitting", 3}, {"", "abc", 3}, {"likes_cöunt", "likes_count", 1},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestClosestColumn(t *testing.T) {
	cols := map[string]counter.Column{"id": {}, "post_id": {}, "user_id": {}, "created_at": {}, "Weight": {}}
	for name, want := range map[string]string{
		"post_idd": "post_id",
		"postid":   "post_id",
		"psot_id":  "post_id",
		"usr_id":   "user_id",
		"weight":   "Weight", // only the case differs: a quoting mistake
		"deleted":  "",       // nothing like it
		"x":        "",       // one letter is no evidence
		"ids":      "id",
	} {
		if got := closest(name, cols); got != want {
			t.Errorf("closest(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestConfigFixWithoutConfigFile(t *testing.T) {
	const fileFix = "create it, or set counters[0].source in walcount.yaml"
	def := counter.Default()
	r := &run{cfg: config.Config{File: "walcount.yaml"}}
	if got := r.configFix(def, fileFix); got != fileFix {
		t.Errorf("with a config file: %q, want %q", got, fileFix)
	}
	r = &run{}
	other := def
	other.Source = "public.comments"
	if got := r.configFix(other, fileFix); got != fileFix {
		t.Errorf("a counter of a config given otherwise: %q, want %q", got, fileFix)
	}
	got := r.configFix(def, fileFix)
	for _, want := range []string{"no config file is in use", "default counter", "needs tables public.likes and public.posts",
		"--database-url", "WALCOUNT_DATABASE_URL", "config file with counters"} {
		if !strings.Contains(got, want) {
			t.Errorf("fix for the default counter without a file does not say %q: %s", want, got)
		}
	}
	if strings.Contains(got, "counters[0]") {
		t.Errorf("fix for the default counter without a file points into a file: %s", got)
	}
}
