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
	// fully connected block of that size holding the GPU. A node's blocks
	// of one size are disjoint and found from the graph; a size is absent
	// when the GPU is in no block of that size.
	Blocks map[int]string
	// Peers is the number of GPUs directly linked to this one.
	Peers int
	// Links is the number of the GPU's active NVLink links, as NVML counts
	// them (18 on an H100, whether they go to peers or to NVSwitches).
	Links int
	// BandwidthGBps is Links times the per-link bandwidth, one direction.
	BandwidthGBps int64
}

// NodeNVLink is the analysed NVLink graph of one node, indexed like the
// inventory's devices.
type NodeNVLink struct {
	GPUs []GPUPlacement
	// Domains lists each domain's member indexes, in domain order.
	Domains [][]int
}

// AnalyzeNVLink derives NVLink domains, blocks, peers and bandwidth
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
		// Behind NVSwitches the pairwise counts overlap (every pair is
		// joined by the same links); the GPU's own count is the truth.
		if d := inv.Devices[i].NVLinks; d > 0 {
			g.Links = d
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

	// Blocks: for each size, largest first, a partition of the GPUs into
	// disjoint fully connected groups found from the graph, whatever the
	// indexes (bridged pairs 0-2 and 1-3 are blocks as much as 0-1 and
	// 2-3). Smaller blocks nest inside larger ones when they can.
	adj := make([][]bool, n) // by rank
	for x := range n {
		adj[x] = make([]bool, n)
		for y := range n {
			adj[x][y] = x != y && lanes[order[x]][order[y]] > 0
		}
	}
	var larger map[int]int // rank -> block number of the next larger size
	for i := len(BlockSizes) - 1; i >= 0; i-- {
		s := BlockSizes[i]
		var region []int
		if larger != nil {
			region = make([]int, n)
			for r := range region {
				region[r] = -1
				if b, ok := larger[r]; ok {
					region[r] = b
				}
			}
		}
		groups := partitionBlocks(adj, s, region)
		// Number blocks by their lowest GPU index so IDs are stable.
		sort.Slice(groups, func(a, b int) bool { return groups[a][0] < groups[b][0] })
		next := map[int]int{}
		for k, g := range groups {
			id := UniqueID(node, fmt.Sprintf("b%d-%d", s, k))
			for _, r := range g {
				out.GPUs[order[r]].Blocks[s] = id
				next[r] = k
			}
		}
		if len(groups) > 0 {
			larger = next
		}
	}
	return out, nil
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
