package demo

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func TestNum(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4200: "-4,200", 12.6: "13"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}

func testFrame() Frame {
	return Frame{
		Elapsed: 3 * time.Second, Duration: 20 * time.Second, Clients: 8, Posts: 1000,
		LikesPerSec: 5000, UnlikesPerSec: 1200, AppTxnsPerSec: 6000, Rows: 15000,
		TxnsPerSec: 6000, Flushes: 3, LagP50: 0.5, LagP99: math.NaN(), SlotLagBytes: 2 << 20,
		Top:   []PostCount{{ID: 501, LikesCount: 900, Count: 910}, {ID: 1, LikesCount: 800, Count: 800}},
		Viral: 501,
	}
}

func TestPlainView(t *testing.T) {
	var out bytes.Buffer
	v := &view{w: &out}
	v.draw(testFrame())
	v.draw(testFrame())
	v.done()
	text := out.String()
	// The legend comes once, first, and explains every field of a line.
	legend, rest, ok := strings.Cut(text, "t=3s")
	if !ok || strings.Contains(rest, "one line per second") {
		t.Fatalf("want the legend once, before the first line:\n%s", text)
	}
	for _, field := range []string{"likes/s", "unlikes/s", "app_txn/s", "rows", "walcount_txn/s", "flushes", "lag_p50", "lag_p99", "slot_lag", "top=#ID:C/N", "#501 is the viral post"} {
		if !strings.Contains(legend, field) {
			t.Errorf("the legend does not explain %q:\n%s", field, legend)
		}
	}
	lines := strings.Split(strings.TrimSuffix("t=3s"+rest, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines after the legend, want 2:\n%s", len(lines), text)
	}
	for _, want := range []string{"t=3s", "likes/s=5000", "flushes=3", "lag_p50=500ms", "lag_p99=-", "slot_lag=2.0 MiB", "top=#501:900/910,#1:800/800"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %q lacks %q", lines[0], want)
		}
	}
}

func TestTerminalViewRedrawsInPlace(t *testing.T) {
	var out bytes.Buffer
	v := &view{w: &out, terminal: true}
	v.draw(testFrame())
	if strings.Contains(out.String(), "one line per second") {
		t.Error("the terminal view prints the legend of the plain lines")
	}
	first := out.Len()
	n := strings.Count(out.String(), "\n")
	v.draw(testFrame())
	second := out.String()[first:]
	if want := "\x1b[" + itoa(n) + "F" + ansiClearDown; !strings.HasPrefix(second, want) {
		t.Errorf("second frame starts with %q, want %q", second[:min(len(second), 12)], want)
	}
	if !strings.Contains(second, "#501 (viral)") || !strings.Contains(second, "+10") || !strings.Contains(second, "exact") {
		t.Errorf("frame lacks the top posts:\n%s", second)
	}
	v.done()
	if !strings.HasSuffix(out.String(), ansiShowCursor) {
		t.Errorf("done does not show the cursor again")
	}
}

func itoa(n int) string { return strings.TrimSpace(num(float64(n))) }
