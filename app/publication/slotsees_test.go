package publication

import "testing"

func TestWrittenSince(t *testing.T) {
	for _, c := range []struct {
		name          string
		x, from, next uint32
		want          bool
	}{
		{"older than the slot's horizon", 100, 200, 300, false},
		{"at the horizon", 200, 200, 300, true},
		{"after the horizon", 250, 200, 300, true},
		{"frozen", 2, 200, 300, false},
		{"window across wraparound, x after it", 10, 4294967200, 50, true},
		{"window across wraparound, x before it", 4294967100, 4294967200, 50, false},
		{"x not yet assigned", 400, 200, 300, false},
	} {
		if got := writtenSince(c.x, c.from, c.next); got != c.want {
			t.Errorf("%s: writtenSince(%d, %d, %d) = %v, want %v", c.name, c.x, c.from, c.next, got, c.want)
		}
	}
}
