package topology

import (
	"fmt"
	"hash/fnv"
	"sort"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// maxIDLen is the longest string attribute value a ResourceSlice accepts.
const maxIDLen = 64

// GPUPlacement is what the NVLink graph says about one GPU.
type GPUPlacement struct {
	// Domain is the cluster-unique ID of the GPU's NVLink connected
	// component; empty when the GPU has no NVLink peer.
	Domain string
	// Blocks maps block size (2, 4, 8) to the cluster-unique ID of the
	// aligned, fully-connected block holding the GPU; a size is absent when
	// the GPU's aligned block of that size is not fully connected.
	Blocks map[int]string
	// Peers is the number of GPUs directly linked to this one.
	Peers int
	// Links is the number of active NVLink lanes to other GPUs.
	Links int
	// BandwidthGBps is Links times the per-lane bandwidth.
	BandwidthGBps int64
}

// NodeNVLink is the analysed NVLink graph of one node, indexed like the
// inventory's devices.
type NodeNVLink struct {
	GPUs []GPUPlacement
	// Domains lists each domain's member indexes, in domain order.
	Domains [][]int
}

// AnalyzeNVLink derives NVLink domains, aligned blocks, peers and bandwidth
// from the link graph. node makes the IDs unique across the cluster.
func AnalyzeNVLink(node string, inv *gpu.Inventory) (*NodeNVLink, error) {
	n := len(inv.Devices)
	pos := make(map[int]int, n) // device index -> position
	for i, d := range inv.Devices {
		if _, dup := pos[d.Index]; dup {
			return nil, fmt.Errorf("analyse NVLink graph: GPU index %d appears twice", d.Index)
		}
		pos[d.Index] = i
	}
	lanes := make([][]int, n)
	for i := range lanes {
		lanes[i] = make([]int, n)
	}
	for _, l := range inv.Links {
		a, okA := pos[l.A]
		b, okB := pos[l.B]
		if !okA || !okB {
			return nil, fmt.Errorf("analyse NVLink graph: link %d-%d names a GPU that was not discovered", l.A, l.B)
		}
		if a == b || l.Count < 0 {
			return nil, fmt.Errorf("analyse NVLink graph: invalid link %d-%d with %d lanes", l.A, l.B, l.Count)
		}
		lanes[a][b] += l.Count
		lanes[b][a] += l.Count
	}

	out := &NodeNVLink{GPUs: make([]GPUPlacement, n)}
	for i := range n {
		g := &out.GPUs[i]
		g.Blocks = map[int]string{}
		for j := range n {
			if lanes[i][j] > 0 {
				g.Peers++
				g.Links += lanes[i][j]
			}
		}
		g.BandwidthGBps = int64(float64(g.Links) * inv.LinkBandwidthGBps)
	}

	// Connected components, numbered by their lowest GPU index so the IDs
	// are stable across restarts.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(x, y int) bool { return inv.Devices[order[x]].Index < inv.Devices[order[y]].Index })
	seen := make([]bool, n)
	for _, start := range order {
		if seen[start] || out.GPUs[start].Peers == 0 {
			continue
		}
		var members []int
		stack := []int{start}
		seen[start] = true
		for len(stack) > 0 {
			cur := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			members = append(members, cur)
			for j := range n {
				if lanes[cur][j] > 0 && !seen[j] {
					seen[j] = true
					stack = append(stack, j)
				}
			}
		}
		id := UniqueID(node, fmt.Sprintf("nvl%d", len(out.Domains)))
		idx := make([]int, 0, len(members))
		for _, m := range members {
			out.GPUs[m].Domain = id
			idx = append(idx, inv.Devices[m].Index)
		}
		sort.Ints(idx)
		out.Domains = append(out.Domains, idx)
	}

	// Aligned blocks: indexes [k*s, (k+1)*s) form a block when all of them
	// were discovered and every pair inside is directly linked.
	last := maxIndex(inv)
	for _, s := range BlockSizes {
		for base := 0; base <= last; base += s {
			members := make([]int, 0, s)
			for idx := base; idx < base+s; idx++ {
				if p, ok := pos[idx]; ok {
					members = append(members, p)
				}
			}
			if len(members) != s || !fullyConnected(lanes, members) {
				continue
			}
			id := UniqueID(node, fmt.Sprintf("b%d-%d", s, base/s))
			for _, m := range members {
				out.GPUs[m].Blocks[s] = id
			}
		}
	}
	return out, nil
}

func maxIndex(inv *gpu.Inventory) int {
	m := -1
	for _, d := range inv.Devices {
		m = max(m, d.Index)
	}
	return m
}

func fullyConnected(lanes [][]int, members []int) bool {
	for x := range members {
		for y := x + 1; y < len(members); y++ {
			if lanes[members[x]][members[y]] == 0 {
				return false
			}
		}
	}
	return true
}

// UniqueID joins a node name and a node-local suffix into an ID that fits
// a string attribute. Long node names are shortened with a hash so two
// nodes never share an ID.
func UniqueID(node, suffix string) string {
	id := node + "-" + suffix
	if len(id) <= maxIDLen {
		return id
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	tail := fmt.Sprintf("-%08x-%s", h.Sum32(), suffix)
	return node[:maxIDLen-len(tail)] + tail
}
