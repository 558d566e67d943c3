package ui

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// Charts are inline SVG written here, on the server: no script draws them, so they show without JavaScript and
// print. Every text in them is escaped; colours come from CSS classes, so they follow the light or dark scheme.

type bar struct {
	Label string
	Value float64
}

func esc(s string) string { return template.HTMLEscapeString(s) }

// barChart draws horizontal bars, one per row, each labelled with its value.
func barChart(title string, bars []bar, format func(float64) string) template.HTML {
	if len(bars) == 0 {
		return template.HTML(`<p class="empty">` + esc(title) + `: nothing in this window.</p>`)
	}
	const rowH, labelW, width = 30, 0, 640
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, b.Value)
	}
	if maxV <= 0 {
		maxV = 1
	}
	h := len(bars)*rowH*2 + 10
	var sb strings.Builder
	fmt.Fprintf(&sb, `<figure class="chart"><figcaption>%s</figcaption><svg viewBox="0 0 %d %d" role="img" aria-label="%s" preserveAspectRatio="xMinYMin meet">`,
		esc(title), width, h, esc(title))
	for i, b := range bars {
		y := i*rowH*2 + 4
		w := b.Value / maxV * float64(width-90-labelW)
		fmt.Fprintf(&sb, `<text class="label" x="0" y="%d">%s</text>`, y+14, esc(b.Label))
		fmt.Fprintf(&sb, `<rect class="bar" x="0" y="%d" width="%.1f" height="%d" rx="3"></rect>`, y+20, math.Max(w, 2), rowH-6)
		fmt.Fprintf(&sb, `<text class="value" x="%.1f" y="%d">%s</text>`, math.Max(w, 2)+6, y+20+rowH-10, esc(format(b.Value)))
	}
	sb.WriteString(`</svg></figure>`)
	return template.HTML(sb.String())
}

// lineChart draws series over the buckets of [from, to) with a y axis in milliseconds; a gap where a bucket has
// no sample. The legend names each series.
func lineChart(title string, ss []series, from, to time.Time) template.HTML {
	const width, height, left, right, top, bottom = 640, 260, 76, 12, 14, 32
	n := 0
	maxV := 0.0
	any := false
	for _, s := range ss {
		n = max(n, len(s.Values))
		for _, v := range s.Values {
			if !math.IsNaN(v) {
				maxV, any = math.Max(maxV, v), true
			}
		}
	}
	if !any || n == 0 {
		return template.HTML(`<figure class="chart"><figcaption>` + esc(title) + `</figcaption><p class="empty">No commands in this window.</p></figure>`)
	}
	top5 := niceMax(maxV)
	plotW, plotH := float64(width-left-right), float64(height-top-bottom)
	x := func(i int) float64 { return float64(left) + (float64(i)+0.5)*plotW/float64(n) }
	y := func(v float64) float64 { return float64(top) + plotH - v/top5*plotH }
	var sb strings.Builder
	fmt.Fprintf(&sb, `<figure class="chart"><figcaption>%s</figcaption><svg viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		esc(title), width, height, esc(title))
	for k := 0; k <= 4; k++ { // grid and y labels
		v := top5 * float64(k) / 4
		fmt.Fprintf(&sb, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"></line>`, left, width-right, y(v), y(v))
		fmt.Fprintf(&sb, `<text class="axis" x="%d" y="%.1f" text-anchor="end">%s</text>`, left-6, y(v)+4, esc(formatCount(v)))
	}
	span := to.Sub(from)
	layout := "15:04"
	if span > 48*time.Hour {
		layout = "Jan 2"
	}
	for _, i := range []int{0, n / 2, n - 1} { // x labels: start, middle, end of the window
		at := from.Add(time.Duration(float64(span) * (float64(i) + 0.5) / float64(n)))
		label, anchor := at.UTC().Format(layout), "middle"
		switch i {
		case 0:
			anchor = "start"
		case n - 1:
			label, anchor = label+" UTC", "end"
		}
		fmt.Fprintf(&sb, `<text class="axis" x="%.1f" y="%d" text-anchor="%s">%s</text>`, x(i), height-8, anchor, esc(label))
	}
	for k, s := range ss {
		var path strings.Builder
		pen := false
		for i, v := range s.Values {
			if math.IsNaN(v) {
				pen = false
				continue
			}
			cmd := "L"
			if !pen {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f ", cmd, x(i), y(v))
			pen = true
		}
		fmt.Fprintf(&sb, `<path class="line s%d" d="%s"></path>`, k, strings.TrimSpace(path.String()))
		for i, v := range s.Values { // points, so a lone bucket still shows; smaller on top, so equal ones all show
			if !math.IsNaN(v) {
				fmt.Fprintf(&sb, `<circle class="dot s%d" cx="%.1f" cy="%.1f" r="%.1f"><title>%s %s</title></circle>`, k, x(i), y(v),
					4.5-1.2*float64(k), esc(s.Name), esc(formatCount(v)))
			}
		}
	}
	sb.WriteString(`</svg><ul class="legend">`)
	for k, s := range ss {
		fmt.Fprintf(&sb, `<li><span class="key s%d"></span>%s</li>`, k, esc(s.Name))
	}
	sb.WriteString(`</ul></figure>`)
	return template.HTML(sb.String())
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func formatCount(v float64) string {
	if v == math.Trunc(v) || math.Abs(v) >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
