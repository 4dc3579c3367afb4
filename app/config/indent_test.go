package config

import (
	"errors"
	"testing"
)

// TestIndentationErrorLine: a YAML line indented to no enclosing block's
// column is reported at that line; go-yaml names the line where the
// enclosing block starts (line 2 or 3 below, before).
func TestIndentationErrorLine(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		line int
	}{
		{"slot: a\ncounters:\n  - name: x\n    source: likes\n   key: post_id\n", 5},
		{"slot: a\nreconcile:\n  batch_size: 10\n interval: 1m\n", 4},
		{"slot: a\nflush_interval: 1s\n\thttp_addr: x\n", 3},
		{"# a comment\nslot: a\ncounters:\n  - name: x\n    where:\n      kind: |\n        text\n    source: likes\n  key: post_id\n", 9},
		// Reported where go-yaml reports it, which is right.
		{"slot: a\n  publication: b\n", 2},
	} {
		_, err := Parse([]byte(tc.yaml), "f.yaml")
		var ce *Error
		if !errors.As(err, &ce) || len(ce.Problems) != 1 {
			t.Errorf("%q: %v, want one problem", tc.yaml, err)
			continue
		}
		if got := ce.Problems[0].Line; got != tc.line {
			t.Errorf("%q: reported at line %d (%v), want %d", tc.yaml, got, err, tc.line)
		}
	}
}
