package preflight

import (
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	tests := []struct {
		name string
		in   Finding
		want string
	}{
		{"ok", Finding{Check: CheckWALLevel, Severity: OK, Message: "wal_level is logical"},
			"ok      wal_level is logical\n"},
		{"ok hides a fix", Finding{Severity: OK, Message: "fine", Fix: "nothing"},
			"ok      fine\n"},
		{"problem with fix", Finding{Severity: Problem, Message: "replica identity of public.likes lacks post_id", Fix: "ALTER TABLE public.likes REPLICA IDENTITY FULL;"},
			"PROBLEM replica identity of public.likes lacks post_id — fix: ALTER TABLE public.likes REPLICA IDENTITY FULL;\n"},
		{"problem without fix", Finding{Severity: Problem, Message: "cannot check x"},
			"PROBLEM cannot check x\n"},
		{"warning", Finding{Severity: Warning, Message: "max_slot_wal_keep_size is -1", Fix: "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB';"},
			"warning max_slot_wal_keep_size is -1 — fix: ALTER SYSTEM SET max_slot_wal_keep_size = '50GB';\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			Format(&b, []Finding{tt.in})
			if b.String() != tt.want {
				t.Errorf("Format = %q, want %q", b.String(), tt.want)
			}
		})
	}
}

func TestHasProblems(t *testing.T) {
	tests := []struct {
		name string
		in   []Finding
		want bool
	}{
		{"none", nil, false},
		{"ok and warning", []Finding{{Severity: OK}, {Severity: Warning}}, false},
		{"one problem", []Finding{{Severity: OK}, {Severity: Problem}}, true},
	}
	for _, tt := range tests {
		if got := HasProblems(tt.in); got != tt.want {
			t.Errorf("%s: HasProblems = %v, want %v", tt.name, got, tt.want)
		}
	}
}
