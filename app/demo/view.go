package demo

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Frame is one second of the live view.
type Frame struct {
	Elapsed, Duration time.Duration
	Clients, Posts    int
	// App side, per second over the last interval.
	LikesPerSec, UnlikesPerSec, AppTxnsPerSec float64
	// Rows is the number of likes rows now (COUNT(*) of likes).
	Rows int64
	// walcount side.
	TxnsPerSec float64 // transactions received from the slot, per second
	Flushes    int64   // flushes committed so far
	// LagP50 and LagP99 are quantiles of the apply lag (source commit →
	// the flush that applied it committed) over the last lagWindow, from
	// every observation of walcount_apply_lag_seconds; NaN when nothing
	// was applied in it.
	LagP50, LagP99 float64
	SlotLagBytes   float64
	Top            []PostCount
	Viral          int64
	Errors         int64
}

// PostCount is a post's cached count next to the truth, read in one
// snapshot.
type PostCount struct {
	ID         int64
	LikesCount int64
	Count      int64
}

// view draws frames: redrawn in place on a terminal, one line per frame
// otherwise.
type view struct {
	w        io.Writer
	terminal bool
	lines    int  // lines of the last frame drawn in place
	legend   bool // the legend of the plain lines was printed
}

// ANSI sequences used by the terminal view.
const (
	ansiHideCursor = "\x1b[?25l"
	ansiShowCursor = "\x1b[?25h"
	ansiClearDown  = "\x1b[J"  // erase from the cursor to the end of the screen
	ansiBold       = "\x1b[1m" // bold
	ansiDim        = "\x1b[2m"
	ansiReset      = "\x1b[0m"
)

// draw shows f.
func (v *view) draw(f Frame) {
	if !v.terminal {
		// The terse fields need saying once, before the first line; the
		// terminal view labels them in place.
		if !v.legend {
			v.legend = true
			io.WriteString(v.w, plainLegend(f))
		}
		fmt.Fprintln(v.w, plainLine(f))
		return
	}
	var b strings.Builder
	if v.lines == 0 {
		b.WriteString(ansiHideCursor)
	} else {
		// Back to the first line of the previous frame.
		fmt.Fprintf(&b, "\x1b[%dF", v.lines)
	}
	b.WriteString(ansiClearDown)
	text := terminalFrame(f)
	b.WriteString(text)
	v.lines = strings.Count(text, "\n")
	io.WriteString(v.w, b.String())
}

// done leaves the last frame on screen and gives the cursor back.
func (v *view) done() {
	if v.terminal && v.lines > 0 {
		io.WriteString(v.w, ansiShowCursor)
	}
	v.lines = 0
}

// terminalFrame renders f as a block of lines, each ending in a newline.
func terminalFrame(f Frame) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%swalcount demo%s  %d clients, %d posts, %s of %s   %s(Ctrl-C stops early)%s\n",
		ansiBold, ansiReset, f.Clients, f.Posts, secs(f.Elapsed), secs(f.Duration), ansiDim, ansiReset)
	b.WriteString("\n")
	fmt.Fprintf(&b, "  app       %9s likes/s  %9s unlikes/s  %9s txn/s   %s likes rows\n",
		num(f.LikesPerSec), num(f.UnlikesPerSec), num(f.AppTxnsPerSec), num(float64(f.Rows)))
	fmt.Fprintf(&b, "  walcount  %9s txn/s    %9s flushes    apply lag p50 %s  p99 %s   slot lag %s\n",
		num(f.TxnsPerSec), num(float64(f.Flushes)), lag(f.LagP50), lag(f.LagP99), size(f.SlotLagBytes))
	if f.Errors > 0 {
		fmt.Fprintf(&b, "  app errors: %d\n", f.Errors)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  %-14s %12s %12s   %s\n", "post", "likes_count", "COUNT(*)", "in flight")
	for _, p := range f.Top {
		name := "#" + strconv.FormatInt(p.ID, 10)
		if p.ID == f.Viral {
			name += " (viral)"
		}
		fmt.Fprintf(&b, "  %-14s %12s %12s   %s\n", name, num(float64(p.LikesCount)), num(float64(p.Count)), gap(p))
	}
	return b.String()
}

// plainLegend explains plainLine's fields; it is printed once, before the
// first line.
func plainLegend(f Frame) string {
	return fmt.Sprintf(`one line per second:
  t               time since the load started
  likes/s, unlikes/s, app_txn/s  what the app's clients did, per second
  rows            likes rows now (COUNT(*) of likes)
  walcount_txn/s  transactions walcount received from the slot, per second
  flushes         flushes committed to PostgreSQL so far
  lag_p50, lag_p99  apply lag: from a like's commit to the flush that counted it (last %s)
  slot_lag        WAL the slot holds that walcount has not confirmed
  top=#ID:C/N     the most liked posts: post ID, its likes_count C, its COUNT(*) N (#%d is the viral post; C trails N by what is in flight)
`, secs(lagWindow), f.Viral)
}

// plainLine renders f as one line for logs and pipes.
func plainLine(f Frame) string {
	var b strings.Builder
	fmt.Fprintf(&b, "t=%s likes/s=%.0f unlikes/s=%.0f app_txn/s=%.0f rows=%d walcount_txn/s=%.0f flushes=%d lag_p50=%s lag_p99=%s slot_lag=%s",
		secs(f.Elapsed), f.LikesPerSec, f.UnlikesPerSec, f.AppTxnsPerSec, f.Rows, f.TxnsPerSec, f.Flushes,
		lag(f.LagP50), lag(f.LagP99), size(f.SlotLagBytes))
	if f.Errors > 0 {
		fmt.Fprintf(&b, " errors=%d", f.Errors)
	}
	b.WriteString(" top=")
	for i, p := range f.Top {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "#%d:%d/%d", p.ID, p.LikesCount, p.Count)
	}
	return b.String()
}

func gap(p PostCount) string {
	switch d := p.Count - p.LikesCount; {
	case d == 0:
		return "exact"
	case d > 0:
		return "+" + strconv.FormatInt(d, 10)
	default:
		return strconv.FormatInt(d, 10)
	}
}

func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 0, 64) + "s" }

func lag(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	if s < 1 {
		return strconv.FormatFloat(s*1000, 'f', 0, 64) + "ms"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + "s"
}

// num formats n with thousands separators.
func num(n float64) string {
	if math.IsNaN(n) {
		return "-"
	}
	s := strconv.FormatInt(int64(math.Round(n)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func size(n float64) string {
	switch {
	case math.IsNaN(n):
		return "-"
	case n >= 1<<20:
		return strconv.FormatFloat(n/(1<<20), 'f', 1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(n/(1<<10), 'f', 0, 64) + " KiB"
	default:
		return strconv.FormatFloat(n, 'f', 0, 64) + " B"
	}
}
