package pgversion

import (
	"errors"
	"strings"
	"testing"
)

func TestVersionGates(t *testing.T) {
	tests := []struct {
		v                                                     Version
		str                                                   string
		supported, columnLists, conflicting, reason, failover bool
		idle                                                  bool
		emit                                                  string
	}{
		{130015, "13.15", false, false, false, false, false, false, "pg_logical_emit_message(boolean, text, text)"},
		{140023, "14.23", true, false, false, false, false, false, "pg_logical_emit_message(boolean, text, text)"},
		{150020, "15.20", true, true, false, false, false, false, "pg_logical_emit_message(boolean, text, text)"},
		{160014, "16.14", true, true, true, false, false, false, "pg_logical_emit_message(boolean, text, text)"},
		{170010, "17.10", true, true, true, true, true, false, "pg_logical_emit_message(boolean, text, text, boolean)"},
		{180004, "18.4", true, true, true, true, true, true, "pg_logical_emit_message(boolean, text, text, boolean)"},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.str {
			t.Errorf("%d: String() = %q, want %q", tt.v, got, tt.str)
		}
		if got := tt.v.Supported() == nil; got != tt.supported {
			t.Errorf("%s: supported = %v, want %v", tt.v, got, tt.supported)
		}
		if tt.v.PublicationColumnLists() != tt.columnLists || tt.v.SlotConflicting() != tt.conflicting ||
			tt.v.SlotInvalidationReason() != tt.reason || tt.v.FailoverSlots() != tt.failover || tt.v.IdleSlotTimeout() != tt.idle {
			t.Errorf("%s: feature gates wrong", tt.v)
		}
		if got := tt.v.EmitMessageSignature(); got != tt.emit {
			t.Errorf("%s: EmitMessageSignature() = %q, want %q", tt.v, got, tt.emit)
		}
	}
}

func TestUnsupportedNamesBothVersions(t *testing.T) {
	err := Version(130015).Supported()
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Supported() = %v, want ErrUnsupported", err)
	}
	for _, want := range []string{"PostgreSQL 13.15", "PostgreSQL 14 or later"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
