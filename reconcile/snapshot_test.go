package reconcile

import "testing"

func TestParseSnapshot(t *testing.T) {
	s, err := ParseSnapshot("10:20:15,12")
	if err != nil {
		t.Fatal(err)
	}
	if s.Xmin != 10 || s.Xmax != 20 || len(s.Xip) != 2 || s.Xip[0] != 12 {
		t.Fatalf("snapshot = %+v", s)
	}
	if s, err := ParseSnapshot("7:7:"); err != nil || len(s.Xip) != 0 {
		t.Fatalf("empty xip: %+v %v", s, err)
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x", "5:3:"} {
		if _, err := ParseSnapshot(bad); err == nil {
			t.Errorf("ParseSnapshot(%q): no error", bad)
		}
	}
}

func TestVisibility(t *testing.T) {
	s, _ := ParseSnapshot("100:110:103,107")
	for xid, want := range map[uint32]bool{
		50: true, 99: true, 100: true, 102: true, 103: false, 104: true,
		107: false, 109: true, 110: false, 111: false, 4000: false,
	} {
		if got := s.Visible(xid); got != want {
			t.Errorf("Visible(%d) = %v, want %v", xid, got, want)
		}
	}
}

func TestWidenAcrossEpochs(t *testing.T) {
	const epoch = uint64(3) << 32
	// xmax just past an epoch boundary: xids from the end of the
	// previous epoch are old and visible, small ones are current.
	s := Snapshot{Xmin: epoch - 10, Xmax: epoch + 5}
	if got := s.Widen(0xFFFFFFF8); got != epoch-8 {
		t.Errorf("Widen(0xFFFFFFF8) = %d, want %d", got, epoch-8)
	}
	if got := s.Widen(3); got != epoch+3 {
		t.Errorf("Widen(3) = %d, want %d", got, epoch+3)
	}
	if !s.Visible(0xFFFFFFF8) || !s.Visible(3) {
		t.Error("xids on both sides of the boundary below xmax must be visible")
	}
	if s.Visible(6) {
		t.Error("xid at or past xmax must not be visible")
	}
	// xmax just before a boundary: a transaction that started after the
	// snapshot, past the boundary, is in the next epoch and invisible.
	s = Snapshot{Xmin: epoch - 20, Xmax: epoch - 2}
	if got := s.Widen(1); got != epoch+1 {
		t.Errorf("Widen(1) = %d, want %d", got, epoch+1)
	}
	if s.Visible(1) {
		t.Error("xid past the boundary after xmax must not be visible")
	}
	if !s.Visible(0xFFFFFFF0) {
		t.Error("xid below xmin must be visible")
	}
}
