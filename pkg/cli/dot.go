package cli

import (
	"fmt"
	"hash/fnv"
	"html"
	"io"
	"slices"
	"strings"
)

// Colours of the pictures (DOT and SVG): a free GPU is white with a green
// rim, an unhealthy one red; each holder (Job, group or pod) gets a colour
// of its own, in name order.
const (
	colorFree      = "#ffffff"
	colorFreeRim   = "#2e7d32"
	colorUnhealthy = "#d62728"
)

var holderPalette = []string{"#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#ad494a"}

// holderColors gives every holder in views a colour.
func holderColors(views []NodeView) (names []string, colors map[string]string) {
	colors = map[string]string{}
	for _, v := range views {
		for _, g := range v.GPUs {
			if g.Holder != "" && colors[g.Holder] == "" {
				colors[g.Holder] = "?"
				names = append(names, g.Holder)
			}
		}
	}
	slices.SortFunc(names, natCmp)
	for _, n := range names {
		colors[n] = holderColor(n)
	}
	return names, colors
}

// holderColor is the colour of a holder (namespace/name), from a hash of
// its name: the same in every picture, whichever other Jobs hold GPUs.
func holderColor(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return holderPalette[h.Sum32()%uint32(len(holderPalette))]
}

func gpuFill(g GPU, colors map[string]string) string {
	switch g.State {
	case StateUnhealthy:
		return colorUnhealthy
	case StateAllocated, StateShared:
		return colors[g.Holder]
	}
	return colorFree
}

func gpuTitle(g GPU) string {
	s := fmt.Sprintf("%s: %s", g.Name, g.State)
	switch {
	case len(g.SharedBy) > 0:
		s += fmt.Sprintf(" by %s, %d/%d milliGPU free", strings.Join(g.SharedBy, ", "), g.FreeMilliGPU(), g.MilliGPU)
	case g.Holder != "":
		s += " by " + g.Holder
	}
	if g.Reason != "" {
		s += " (" + g.Reason + ")"
	}
	if g.NVLinkDomain != "" {
		s += ", NVLink domain " + g.NVLinkDomain
	}
	return s
}

// nvlinkGroups splits a node's GPUs (in index order) into runs of one
// NVLink domain; a GPU without NVLink is a run of its own.
func nvlinkGroups(gpus []GPU) [][]GPU {
	var out [][]GPU
	for i, g := range gpus {
		if i == 0 || g.NVLinkDomain == "" || gpus[i-1].NVLinkDomain != g.NVLinkDomain {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], g)
	}
	return out
}

// RenderDOT writes the tree as a Graphviz digraph: core → spine → leaf →
// node, each node a table of its GPUs grouped by NVLink domain.
func RenderDOT(w io.Writer, views []NodeView) error {
	holders, colors := holderColors(views)
	var b strings.Builder
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }
	b.WriteString("digraph gputopo {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=11];\n  edge [arrowhead=none, color=\"#666666\"];\n")
	cores := map[string]bool{}
	for _, s := range groupTree(views) {
		sid := "spine/" + s.name
		fmt.Fprintf(&b, "  %s [label=%s, shape=box, style=\"rounded,filled\", fillcolor=\"#dde5f0\"];\n", q(sid), q(orNone(s.name)))
		if s.core != "" {
			if !cores[s.core] {
				cores[s.core] = true
				fmt.Fprintf(&b, "  %s [label=%s, shape=box, style=\"rounded,filled\", fillcolor=\"#c9d6ea\"];\n", q("core/"+s.core), q(s.core))
			}
			fmt.Fprintf(&b, "  %s -> %s;\n", q("core/"+s.core), q(sid))
		}
		for _, l := range s.leaves {
			lid := "leaf/" + s.name + "/" + l.name
			fmt.Fprintf(&b, "  %s [label=%s, shape=box, style=\"rounded,filled\", fillcolor=\"#eef2f8\"];\n  %s -> %s;\n", q(lid), q(orNone(l.name)), q(sid), q(lid))
			for _, n := range l.nodes {
				fmt.Fprintf(&b, "  %s [shape=plaintext, label=<%s>];\n  %s -> %s;\n", q("node/"+n.Name), dotNodeLabel(n, colors), q(lid), q("node/"+n.Name))
			}
		}
	}
	if len(holders) > 0 {
		b.WriteString("  legend [shape=plaintext, label=<<TABLE BORDER=\"0\" CELLSPACING=\"2\"><TR><TD COLSPAN=\"2\"><B>held by</B></TD></TR>")
		for _, h := range holders {
			fmt.Fprintf(&b, "<TR><TD BGCOLOR=%q WIDTH=\"12\"> </TD><TD ALIGN=\"LEFT\">%s</TD></TR>", colors[h], html.EscapeString(h))
		}
		b.WriteString("</TABLE>>];\n")
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func dotNodeLabel(n NodeView, colors map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="3" COLOR="#888888"><TR><TD ALIGN="LEFT"><B>%s</B><BR/><FONT POINT-SIZE="9">%s %d/%d free</FONT></TD></TR><TR><TD><TABLE BORDER="0" CELLSPACING="4"><TR>`,
		html.EscapeString(n.Name), html.EscapeString(n.Profile), n.Free(), len(n.GPUs))
	for _, grp := range nvlinkGroups(n.GPUs) {
		border := 0
		if grp[0].NVLinkDomain != "" {
			border = 1
		}
		fmt.Fprintf(&b, `<TD><TABLE BORDER="%d" STYLE="ROUNDED" CELLBORDER="1" CELLSPACING="2" COLOR="#555555"><TR>`, border)
		for _, g := range grp {
			fmt.Fprintf(&b, `<TD BGCOLOR=%q COLOR=%q WIDTH="14" HEIGHT="14" TOOLTIP=%q><FONT POINT-SIZE="8">%d</FONT></TD>`,
				gpuFill(g, colors), colorFreeRim, html.EscapeString(gpuTitle(g)), g.Index)
		}
		b.WriteString(`</TR></TABLE></TD>`)
	}
	b.WriteString(`</TR></TABLE></TD></TR></TABLE>`)
	return b.String()
}
