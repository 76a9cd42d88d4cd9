package main

import (
	"strings"
	"unicode/utf8"
)

// colGap separates the columns of a table.
const colGap = "  "

// minMessage is the narrowest message column worth printing.
const minMessage = 10

// minWrap is the narrowest column a message is wrapped in; with less room
// it goes on lines of its own under its row.
const minWrap = 24

// column is one column of a textTable.
type column struct {
	header string
	cells  []string
	// colors holds an SGR colour per cell, or nothing.
	colors []string
	// max caps the column's width; 0 lets it be as wide as its widest cell.
	max int
	// min is how narrow the column may be cut when the last column lacks
	// room; 0 never cuts it.
	min int
	// cut shortens a cell to a width; fit when nil.
	cut func(s string, w int) string
}

// lastMode says what a table does with a last column longer than the
// room left for it.
type lastMode int

const (
	lastCut  lastMode = iota // cut it, marking the cut with "…"
	lastWrap                 // wrap it onto lines of its own, under itself
	lastFull                 // print it whole, past the width (get -o wide)
)

// textTable draws a table whose last column (a message) gets the width
// the others leave. The others are as wide as their widest cell (up to
// their max); when that leaves the last column less than room (nothing,
// when it wraps), the columns in shrink give up width, in that order,
// down to their min.
type textTable struct {
	cols   []*column
	shrink []int
	room   int
	// dropBelow leaves the last column out when fewer columns than this
	// remain for it; 0 never does.
	dropBelow int
	last      lastMode
}

func (t *textTable) add(c *column) *column {
	t.cols = append(t.cols, c)
	return c
}

// render draws the table in v's width and colours, with a header line
// unless v.noHeaders.
func (t *textTable) render(v view) string {
	n := len(t.cols) - 1
	widths := make([]int, n)
	used := 0
	for i, c := range t.cols[:n] {
		widths[i] = len(c.header)
		for _, s := range c.cells {
			widths[i] = max(widths[i], utf8.RuneCountInString(s))
		}
		if c.max > 0 {
			widths[i] = min(widths[i], max(c.max, len(c.header)))
		}
		used += widths[i] + len(colGap)
	}
	lastW := v.width - used
	room := t.room
	if t.last == lastWrap {
		// A message that lacks room goes under its row: cut the other
		// columns only as far as they must to fit.
		room = 0
	}
	if t.last != lastFull {
		for _, i := range t.shrink {
			c := t.cols[i]
			if lastW >= room || widths[i] <= c.min {
				continue
			}
			give := min(room-lastW, widths[i]-c.min)
			widths[i] -= give
			lastW += give
		}
	}
	showLast := t.dropBelow == 0 || lastW >= t.dropBelow || t.last == lastFull
	lead := v.width - lastW // where the last column starts
	below := t.last == lastWrap && lastW < minWrap
	if below {
		// No room beside the other columns: the message goes under
		// its row, indented.
		lead, lastW = len(colGap)*2, v.width-len(colGap)*2
	}

	var b strings.Builder
	line := func(row int, header bool) {
		var l strings.Builder
		for i, c := range t.cols[:n] {
			s := c.header
			if !header {
				s = c.cells[row]
			}
			cut := c.cut
			if cut == nil {
				cut = fit
			}
			s = pad(cut(s, widths[i]), widths[i])
			if !header && row < len(c.colors) {
				s = v.paint(c.colors[row], s)
			}
			l.WriteString(s + colGap)
		}
		msg := t.cols[n].header
		if !header {
			msg = t.cols[n].cells[row]
		}
		var rest []string
		switch {
		case !showLast:
			msg = ""
		case t.last == lastCut:
			msg = fit(msg, lastW)
		case t.last == lastWrap && below && !header:
			rest, msg = wrap(msg, lastW), ""
		case t.last == lastWrap && below:
			msg = ""
		case t.last == lastWrap:
			lines := wrap(msg, lastW)
			msg, rest = lines[0], lines[1:]
		}
		s := strings.TrimRight(l.String()+msg, " ")
		if header {
			s = v.paint(sgrBold, s)
		}
		b.WriteString(s + "\n")
		for _, r := range rest {
			if r != "" {
				b.WriteString(strings.Repeat(" ", lead) + r + "\n")
			}
		}
	}
	if !v.noHeaders {
		line(0, true)
	}
	for row := range t.cols[n].cells {
		line(row, false)
	}
	return b.String()
}
