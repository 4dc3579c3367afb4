package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Chart geometry, in SVG user units.
const (
	svgWidth   = 960
	svgHeight  = 440
	svgTop     = 96 // room for the title and two rows of legend
	svgBottom  = 56 // room for the x labels
	svgLeft    = 64 // room for the y labels
	svgRight   = 16
	panelGap   = 40
	groupInner = 0.8 // share of a group's width taken by its bars
)

// barColors are the configurations' colours, a to e.
var barColors = map[string]string{"a": "#7f8c8d", "b": "#2e86de", "c": "#e67e22", "d": "#c0392b", "e": "#27ae60"}

// svg draws likes/s per configuration and client count: one panel per
// workload, one group of bars per client count. Hand-written SVG, no
// dependencies; it renders in browsers and on GitHub.
func (r *results) svg() string {
	w := r.write
	counts := clientCountsOf(w)
	maxTPS := 0.0
	for _, c := range w.cells {
		maxTPS = math.Max(maxTPS, c.res.tps())
	}
	top, step := niceScale(maxTPS)

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">App write path: likes/s by configuration and clients (higher is better)</text>`+"\n", svgLeft)
	fmt.Fprintf(&b, `<text x="%d" y="42" fill="#555">%s, %s. synchronous_commit=on, fsync on.</text>`+"\n",
		svgLeft, html.EscapeString(r.started.Format("2006-01-02")), html.EscapeString(fmt.Sprintf("%d CPUs, %s", r.machine.cpus, r.machine.postgres)))
	// Legend.
	x, y := svgLeft, 54
	for _, cfg := range appConfigs {
		label := configHeads[cfg.key]
		w := 22 + 7*len(label)
		if x > svgLeft && x+w > svgWidth-svgRight {
			x, y = svgLeft, y+18
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`, x, y, barColors[cfg.key])
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x+16, y+11, html.EscapeString(label))
		x += w
	}

	plotH := float64(svgHeight - svgTop - svgBottom)
	panelW := float64(svgWidth-svgLeft-svgRight-panelGap) / 2
	yOf := func(v float64) float64 { return float64(svgTop) + plotH*(1-v/top) }
	for p, wl := range workloads {
		x0 := float64(svgLeft) + float64(p)*(panelW+panelGap)
		// Grid and y labels.
		for v := 0.0; v <= top+step/2; v += step {
			y := yOf(v)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x0, y, x0+panelW, y)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", x0-6, y+4, compact(v))
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x0, svgTop, x0, yOf(0))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x0, yOf(0), x0+panelW, yOf(0))
		groupW := panelW / float64(len(counts))
		barW := groupW * groupInner / float64(len(appConfigs))
		for g, n := range counts {
			gx := x0 + float64(g)*groupW + groupW*(1-groupInner)/2
			for i, cfg := range appConfigs {
				c, ok := w.cell(cfg.key, wl.name, n)
				if !ok {
					continue
				}
				v := c.res.tps()
				bx, by := gx+float64(i)*barW, yOf(v)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s, %d clients: %s likes/s</title></rect>`+"\n",
					bx, by, barW-2, yOf(0)-by, barColors[cfg.key], html.EscapeString(configHeads[cfg.key]), html.EscapeString(wl.name), n, thousands(v))
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#333">%s</text>`+"\n",
					bx+(barW-2)/2, by-3, compact(v))
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d client%s</text>`+"\n",
				x0+float64(g)*groupW+groupW/2, yOf(0)+18, n, plural(n))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>`+"\n",
			x0+panelW/2, svgHeight-12, html.EscapeString(wl.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceScale returns an axis top above max and a round step that divides it.
func niceScale(max float64) (top, step float64) {
	if max <= 0 {
		return 1, 1
	}
	raw := max / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	return math.Ceil(max/step) * step, step
}

// compact formats 12345 as 12.3k.
func compact(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return fmt.Sprintf("%.0f", v)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
