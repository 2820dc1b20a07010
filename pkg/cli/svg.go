package cli

import (
	"fmt"
	"html"
	"io"
	"strings"
)

// Geometry of the SVG picture, in pixels.
const (
	svgMargin    = 20
	svgCell      = 16 // a GPU
	svgCellGap   = 3  // between GPUs of one NVLink domain
	svgBlockGap  = 5  // extra gap between aligned quads of a domain
	svgGroupGap  = 8  // between NVLink domains
	svgPad       = 8  // inside a node box
	svgSwitchH   = 26 // a switch box
	svgRowGap    = 34 // between tiers
	svgNodeGap   = 12 // between nodes of a leaf
	svgColGap    = 24 // between leaves
	svgSpineGap  = 40 // between spines
	svgBusIndent = 12 // the leaf's bus line, left of its nodes
	svgCharW     = 6.6
)

// RenderSVG draws core → spine → leaf → node → NVLink domains as a
// self-contained SVG: each GPU a square, white when free, red when
// unhealthy, in its holder's colour when allocated; GPUs of one NVLink
// domain framed together. Hovering a GPU names it and its holder. Nodes
// reserved for a waiting group have a dashed frame in its colour; the
// waiting groups are listed below the legend.
func RenderSVG(w io.Writer, views []NodeView, waiting []WaitingGroup) error {
	holders, colors := holderColors(views)
	spines := groupTree(views)
	hasCore := false
	for _, s := range spines {
		hasCore = hasCore || s.core != ""
	}
	var body strings.Builder
	y0 := svgMargin + 40 // below the title
	coreY := y0
	spineY := y0
	if hasCore {
		spineY += svgSwitchH + svgRowGap
	}
	leafY := spineY + svgSwitchH + svgRowGap
	nodeY := leafY + svgSwitchH + svgRowGap/2

	x := float64(svgMargin)
	bottom := nodeY
	type placed struct{ cx, bottom float64 }
	var spineCenters []struct {
		core string
		cx   float64
	}
	for si, s := range spines {
		if si > 0 {
			x += svgSpineGap - svgColGap
		}
		var leaves []placed
		for _, l := range s.leaves {
			label := leafLabel(l)
			colW := svgSwitchW(label)
			for _, n := range l.nodes {
				colW = max(colW, svgBusIndent+nodeWidth(n))
			}
			lx := x + (colW-svgSwitchW(label))/2
			switchBox(&body, lx, float64(leafY), label, "#eef2f8")
			leafCx := lx + svgSwitchW(label)/2
			// The leaf's bus: down its column's left side, a tick to each node.
			busX := x + svgBusIndent/2
			y := float64(nodeY)
			fmt.Fprintf(&body, `<path d="M%.1f %d V%.1f H%.1f" class="wire"/>`+"\n", leafCx, leafY+svgSwitchH, y-svgRowGap/4, busX)
			lastMid := y
			for _, n := range l.nodes {
				h := drawNode(&body, x+svgBusIndent, y, n, colors)
				lastMid = y + h/2
				fmt.Fprintf(&body, `<path d="M%.1f %.1f H%.1f" class="wire"/>`+"\n", busX, lastMid, x+svgBusIndent)
				y += h + svgNodeGap
			}
			fmt.Fprintf(&body, `<path d="M%.1f %.1f V%.1f" class="wire"/>`+"\n", busX, float64(nodeY)-svgRowGap/4, lastMid)
			bottom = max(bottom, int(y))
			leaves = append(leaves, placed{cx: leafCx})
			x += colW + svgColGap
		}
		sx := (leaves[0].cx+leaves[len(leaves)-1].cx)/2 - svgSwitchW(orNone(s.name))/2
		switchBox(&body, sx, float64(spineY), orNone(s.name), "#dde5f0")
		scx := sx + svgSwitchW(orNone(s.name))/2
		mid := float64(spineY+svgSwitchH) + svgRowGap/2
		for _, l := range leaves {
			fmt.Fprintf(&body, `<path d="M%.1f %d V%.1f H%.1f V%d" class="wire"/>`+"\n", scx, spineY+svgSwitchH, mid, l.cx, leafY)
		}
		spineCenters = append(spineCenters, struct {
			core string
			cx   float64
		}{s.core, scx})
	}
	if hasCore {
		for i := 0; i < len(spineCenters); {
			j := i
			for j < len(spineCenters) && spineCenters[j].core == spineCenters[i].core {
				j++
			}
			if c := spineCenters[i].core; c != "" {
				cx := (spineCenters[i].cx + spineCenters[j-1].cx) / 2
				switchBox(&body, cx-svgSwitchW(c)/2, float64(coreY), c, "#c9d6ea")
				mid := float64(coreY+svgSwitchH) + svgRowGap/2
				for _, s := range spineCenters[i:j] {
					fmt.Fprintf(&body, `<path d="M%.1f %d V%.1f H%.1f V%d" class="wire"/>`+"\n", cx, coreY+svgSwitchH, mid, s.cx, spineY)
				}
			}
			i = j
		}
	}
	width := max(x-svgColGap+svgMargin, 520)
	height := legend(&body, float64(bottom)+8, width, holders, colors)
	height = waitingList(&body, height+8, width, waiting) + svgMargin

	total, free := 0, 0
	for _, v := range views {
		total += len(v.GPUs)
		free += v.Free()
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">`+"\n", width, height, width, height)
	b.WriteString(`<style>.wire{fill:none;stroke:#8a8f98;stroke-width:1.2}.sw{stroke:#5b6b82;stroke-width:1}.node{fill:#fbfbfb;stroke:#9aa0a6}.dom{fill:none;stroke:#444;stroke-width:1.2}.gpu{stroke-width:1}.idx{font-size:8px;text-anchor:middle}.small{font-size:10px;fill:#555}</style>` + "\n")
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="15" font-weight="bold">gputopo: %d nodes, %d/%d GPUs free</text>`+"\n", svgMargin, svgMargin+12, len(views), free, total)
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="small">core → spine → leaf → node; a frame is an NVLink domain, a square a GPU (hover for details)</text>`+"\n", svgMargin, svgMargin+28)
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// leafLabel is a leaf's name and its free GPUs: "leaf-0 · 12/16 free".
func leafLabel(l leafGroup) string {
	free, total := 0, 0
	for _, n := range l.nodes {
		free += n.Free()
		total += len(n.GPUs)
	}
	return fmt.Sprintf("%s · %d/%d free", orNone(l.name), free, total)
}

func svgSwitchW(label string) float64 { return max(84, float64(len([]rune(label)))*svgCharW+20) }

func switchBox(b *strings.Builder, x, y float64, label, fill string) {
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" rx="6" fill="%s" class="sw"/>`+"\n", x, y, svgSwitchW(label), svgSwitchH, fill)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">%s</text>`+"\n", x+svgSwitchW(label)/2, y+svgSwitchH/2+4, html.EscapeString(label))
}

// gpuRowWidth is the width of a node's GPU row.
func gpuRowWidth(gpus []GPU) float64 {
	w := 0.0
	for i, grp := range nvlinkGroups(gpus) {
		if i > 0 {
			w += svgGroupGap
		}
		w += groupWidth(grp)
	}
	return w
}

func groupWidth(grp []GPU) float64 {
	w := 2.0*svgCellGap + float64(len(grp))*svgCell + float64(len(grp)-1)*svgCellGap
	for i := 1; i < len(grp); i++ {
		if grp[i].NVLinkBlock4 != grp[i-1].NVLinkBlock4 {
			w += svgBlockGap
		}
	}
	return w
}

func nodeLines(n NodeView) (title, sub, held, reserved string) {
	if n.ReservedFor != "" {
		reserved = "reserved for " + n.ReservedFor
	}
	return n.Name, fmt.Sprintf("%s · %d/%d free", n.Profile, n.Free(), len(n.GPUs)), strings.Join(n.Holders(), " "), reserved
}

func nodeWidth(n NodeView) float64 {
	title, sub, held, reserved := nodeLines(n)
	text := max(float64(len(title))*svgCharW*1.1, float64(len([]rune(sub)))*svgCharW*0.92,
		float64(len([]rune(held)))*svgCharW*0.92, float64(len([]rune(reserved)))*svgCharW*0.92)
	return 2*svgPad + max(gpuRowWidth(n.GPUs), text)
}

// drawNode draws a node box at (x, y) and returns its height.
func drawNode(b *strings.Builder, x, y float64, n NodeView, colors map[string]string) float64 {
	title, sub, held, reserved := nodeLines(n)
	h := float64(svgPad + 28 + svgCell + 2*svgCellGap + svgPad)
	if held != "" {
		h += 13
	}
	if reserved != "" {
		h += 13
	}
	fmt.Fprintf(b, `<g><title>%s</title><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="4" class="node"/>`+"\n",
		html.EscapeString(n.Name), x, y, nodeWidth(n), h)
	if reserved != "" {
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="4" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="5 3" class="reserved"/>`+"\n",
			x, y, nodeWidth(n), h, holderColor(n.ReservedFor))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="12" font-weight="bold">%s</text>`+"\n", x+svgPad, y+svgPad+10, html.EscapeString(title))
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="small">%s</text></g>`+"\n", x+svgPad, y+svgPad+23, html.EscapeString(sub))
	gx, gy := x+svgPad, y+svgPad+28
	for i, grp := range nvlinkGroups(n.GPUs) {
		if i > 0 {
			gx += svgGroupGap
		}
		if grp[0].NVLinkDomain != "" {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" rx="4" class="dom"><title>NVLink domain %s</title></rect>`+"\n",
				gx, gy, groupWidth(grp), svgCell+2*svgCellGap, html.EscapeString(grp[0].NVLinkDomain))
		}
		cx := gx + svgCellGap
		for j, g := range grp {
			if j > 0 {
				cx += svgCellGap
				if g.NVLinkBlock4 != grp[j-1].NVLinkBlock4 {
					cx += svgBlockGap
				}
			}
			drawGPU(b, cx, gy+svgCellGap, g, colors)
			cx += svgCell
		}
		gx += groupWidth(grp)
	}
	ty := gy + svgCell + 2*svgCellGap + 11
	if held != "" {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="small">%s</text>`+"\n", x+svgPad, ty, html.EscapeString(held))
		ty += 13
	}
	if reserved != "" {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="small" fill="%s">%s</text>`+"\n", x+svgPad, ty, holderColor(n.ReservedFor), html.EscapeString(reserved))
	}
	return h
}

// waitingList draws the waiting groups below y, one line each, and
// returns its bottom: a dashed swatch in the group's colour, its name and
// pods, why it waits and what is reserved for it.
func waitingList(b *strings.Builder, y, width float64, waiting []WaitingGroup) float64 {
	if len(waiting) == 0 {
		return y
	}
	y += 16
	fmt.Fprintf(b, `<text x="%d" y="%.1f" font-size="12" font-weight="bold">waiting: %s</text>`+"\n", svgMargin, y, plural(len(waiting), "group"))
	maxRunes := int((width - 2*svgMargin - svgCell - 6) / (svgCharW * 0.92))
	for _, g := range waiting {
		y += 18
		line := g.Group + " · " + plural(g.Pods, "pod")
		if g.Reason != "" {
			line += " · " + g.Reason + ": " + g.Message
		}
		if r := g.Reservation; r != nil {
			line += fmt.Sprintf(" · reserved %s in %s until %s", strings.Join(r.Nodes, ","), r.Domain, r.Until.UTC().Format("15:04:05Z"))
		}
		full := line
		if r := []rune(line); len(r) > maxRunes {
			line = string(r[:maxRunes-1]) + "…"
		}
		fmt.Fprintf(b, `<g><title>%s</title><rect x="%d" y="%.1f" width="%d" height="%d" rx="2" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="4 2"/>`,
			html.EscapeString(full), svgMargin, y-12, svgCell, svgCell, holderColor(g.Group))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" font-size="11">%s</text></g>`+"\n", svgMargin+svgCell+6, y, html.EscapeString(line))
	}
	return y + 6
}

func drawGPU(b *strings.Builder, x, y float64, g GPU, colors map[string]string) {
	fill, rim, text := gpuFill(g, colors), colorFreeRim, "#222"
	if g.State != StateFree {
		rim, text = "#333", "#fff"
	}
	if g.State == StateShared {
		fill, text = colorFree, "#222"
	}
	fmt.Fprintf(b, `<g><title>%s</title><rect x="%.1f" y="%.1f" width="%d" height="%d" rx="2" fill="%s" stroke="%s" class="gpu"/>`,
		html.EscapeString(gpuTitle(g)), x, y, svgCell, svgCell, fill, rim)
	if g.State == StateShared {
		// Filled from the bottom as far as its shares take it.
		h := float64(svgCell) * float64(g.UsedMilliGPU) / float64(g.MilliGPU)
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s" class="share"/>`, x, y+svgCell-h, svgCell, h, gpuFill(g, colors))
	}
	if g.State == StateUnhealthy {
		fmt.Fprintf(b, `<path d="M%.1f %.1f l%d %d M%.1f %.1f l%d %d" stroke="#fff" stroke-width="2"/>`,
			x+4, y+4, svgCell-8, svgCell-8, x+svgCell-4, y+4, -(svgCell - 8), svgCell-8)
	} else {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="idx" fill="%s">%d</text>`, x+svgCell/2, y+svgCell/2+3, text, g.Index)
	}
	b.WriteString("</g>\n")
}

// legend draws the key below y, wrapping at width, and returns its bottom.
func legend(b *strings.Builder, y, width float64, holders []string, colors map[string]string) float64 {
	type item struct{ fill, label string }
	items := []item{{colorFree, "free"}, {colorUnhealthy, "unhealthy"}}
	for _, h := range holders {
		items = append(items, item{colors[h], h})
	}
	x := float64(svgMargin)
	y += 14
	for _, it := range items {
		w := svgCell + 6 + float64(len(it.label))*svgCharW + 18
		if x+w > width-svgMargin && x > svgMargin {
			x, y = svgMargin, y+22
		}
		rim := "#333"
		if it.fill == colorFree {
			rim = colorFreeRim
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%d" height="%d" rx="2" fill="%s" stroke="%s" class="gpu"/>`, x, y, svgCell, svgCell, it.fill, rim)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11">%s</text>`+"\n", x+svgCell+6, y+12, html.EscapeString(it.label))
		x += w
	}
	return y + svgCell
}
