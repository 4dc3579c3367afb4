package main

import (
	"slices"
	"strings"
	"testing"
)

// TestSoakFaultsFor: the default rotation has the failover from
// PostgreSQL 17 on and says it left it out before; a failover asked for
// on an older server is refused rather than run without failover slots.
func TestSoakFaultsFor(t *testing.T) {
	got, note, err := soakFaultsFor(17, nil)
	if err != nil || note != "" || !slices.Equal(got, soakFaults) || !slices.Contains(got, "failover") {
		t.Errorf("on 17: %v, %q, %v; want every fault", got, note, err)
	}
	got, note, err = soakFaultsFor(16, nil)
	if err != nil || slices.Contains(got, "failover") || len(got) != len(soakFaults)-1 || !strings.Contains(note, "failover left out") {
		t.Errorf("on 16: %v, %q, %v; want every fault but the failover, and a note", got, note, err)
	}
	if _, _, err := soakFaultsFor(15, []string{"kill -9", "failover"}); err == nil {
		t.Error("a failover asked for on 15: no error")
	}
	got, _, err = soakFaultsFor(18, []string{"failover", "kill -9"})
	if err != nil || !slices.Equal(got, []string{"failover", "kill -9"}) {
		t.Errorf("on 18, asked failover and kill -9: %v, %v", got, err)
	}
}
