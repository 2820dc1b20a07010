package topology_test

import (
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/topology"
)

// blocksOf groups GPU indexes by their block ID of the given size, blocks
// ordered by their lowest index.
func blocksOf(inv *gpu.Inventory, nv *topology.NodeNVLink, size int) [][]int {
	byID := map[string][]int{}
	for i, g := range nv.GPUs {
		if id, ok := g.Blocks[size]; ok {
			byID[id] = append(byID[id], inv.Devices[i].Index)
		}
	}
	var out [][]int
	for _, b := range byID {
		sort.Ints(b)
		out = append(out, b)
	}
	sort.Slice(out, func(a, b int) bool { return out[a][0] < out[b][0] })
	return out
}

func TestAnalyzeNVLinkProfiles(t *testing.T) {
	type want struct {
		domains [][]int
		blocks  map[int][][]int
		peers   []int
	}
	all8 := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	pairs := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	tests := map[string]want{
		// NVSwitch: one domain, every block size.
		"dgx-h100": {domains: all8, blocks: map[int][][]int{2: pairs, 4: quads, 8: all8}, peers: []int{7, 7, 7, 7, 7, 7, 7, 7}},
		// Hybrid cube-mesh: connected as a whole, quads 0-3 and 4-7, no
		// fully-connected eight.
		"dgx1-v100": {domains: all8, blocks: map[int][][]int{2: pairs, 4: quads}, peers: []int{4, 4, 4, 4, 4, 4, 4, 4}},
		// Bridged pairs: four domains of two, pairs only.
		"hgx-pcie-pairs": {domains: pairs, blocks: map[int][][]int{2: pairs}, peers: []int{1, 1, 1, 1, 1, 1, 1, 1}},
		"pcie-only":      {blocks: map[int][][]int{}, peers: []int{0, 0, 0, 0, 0, 0, 0, 0}},
		"gb200-nvl72-tray": {domains: [][]int{{0, 1, 2, 3}}, blocks: map[int][][]int{2: {{0, 1}, {2, 3}}, 4: {{0, 1, 2, 3}}},
			peers: []int{3, 3, 3, 3}},
	}
	for name, w := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := sim.LoadBuiltin(name)
			if err != nil {
				t.Fatal(err)
			}
			inv := p.Inventory("node-a")
			nv, err := topology.AnalyzeNVLink("node-a", inv)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(w.domains, nv.Domains); diff != "" {
				t.Errorf("domains (-want +got):\n%s", diff)
			}
			got := map[int][][]int{}
			for _, s := range topology.BlockSizes {
				if b := blocksOf(inv, nv, s); b != nil {
					got[s] = b
				}
			}
			if diff := cmp.Diff(w.blocks, got); diff != "" {
				t.Errorf("blocks (-want +got):\n%s", diff)
			}
			var peers []int
			for _, g := range nv.GPUs {
				peers = append(peers, g.Peers)
			}
			if diff := cmp.Diff(w.peers, peers); diff != "" {
				t.Errorf("peers (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAnalyzeNVLinkBandwidthAndIDs(t *testing.T) {
	p, err := sim.LoadBuiltin("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	nv, err := topology.AnalyzeNVLink("n1", p.Inventory("n1"))
	if err != nil {
		t.Fatal(err)
	}
	// Six NVLink2 lanes of 25 GB/s on every DGX-1 V100 GPU.
	for i, g := range nv.GPUs {
		if g.Links != 6 || g.BandwidthGBps != 150 {
			t.Errorf("GPU %d: links=%d bandwidth=%d, want 6 and 150", i, g.Links, g.BandwidthGBps)
		}
	}
	other, _ := topology.AnalyzeNVLink("n2", p.Inventory("n2"))
	if nv.GPUs[0].Domain == other.GPUs[0].Domain || nv.GPUs[0].Blocks[4] == other.GPUs[0].Blocks[4] {
		t.Errorf("IDs must differ between nodes: %q vs %q", nv.GPUs[0].Domain, other.GPUs[0].Domain)
	}
}

func TestAnalyzeNVLinkSparseIndexes(t *testing.T) {
	// GPU 2 is missing (e.g. fell off the bus): no block may include it and
	// the pair block {0,1} survives.
	inv := &gpu.Inventory{
		Devices: []gpu.Device{{Index: 0}, {Index: 1}, {Index: 3}},
		Links:   []gpu.Link{{A: 0, B: 1, Count: 2}, {A: 1, B: 3, Count: 2}, {A: 0, B: 3, Count: 2}},
	}
	nv, err := topology.AnalyzeNVLink("n", inv)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]int{{0, 1}}, blocksOf(inv, nv, 2)); diff != "" {
		t.Errorf("pairs (-want +got):\n%s", diff)
	}
	if b := blocksOf(inv, nv, 4); b != nil {
		t.Errorf("no quad may form without GPU 2, got %v", b)
	}
}

func TestAnalyzeNVLinkRejectsBadGraph(t *testing.T) {
	for name, inv := range map[string]*gpu.Inventory{
		"unknown GPU":   {Devices: []gpu.Device{{Index: 0}}, Links: []gpu.Link{{A: 0, B: 5, Count: 1}}},
		"self link":     {Devices: []gpu.Device{{Index: 0}}, Links: []gpu.Link{{A: 0, B: 0, Count: 1}}},
		"duplicate GPU": {Devices: []gpu.Device{{Index: 0}, {Index: 0}}},
	} {
		if _, err := topology.AnalyzeNVLink("n", inv); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
}

func TestUniqueIDFitsAttribute(t *testing.T) {
	long := "a-very-long-node-name-that-goes-on-and-on-well-past-the-limit-of-sixty-four"
	a := topology.UniqueID(long+"-1", "nvl0")
	b := topology.UniqueID(long+"-2", "nvl0")
	if len(a) > 64 || len(b) > 64 || a == b {
		t.Errorf("UniqueID must fit 64 chars and stay unique: %q %q", a, b)
	}
	if got := topology.UniqueID("n1", "nvl0"); got != "n1-nvl0" {
		t.Errorf("short names stay readable, got %q", got)
	}
}

// graphInventory builds n GPUs with the given undirected links (2 lanes
// each), listed in the device order given by perm (nil: index order).
func graphInventory(n int, edges [][2]int, perm []int) *gpu.Inventory {
	inv := &gpu.Inventory{LinkBandwidthGBps: 25}
	for i := range n {
		idx := i
		if perm != nil {
			idx = perm[i]
		}
		inv.Devices = append(inv.Devices, gpu.Device{Index: idx})
	}
	for _, e := range edges {
		inv.Links = append(inv.Links, gpu.Link{A: min(e[0], e[1]), B: max(e[0], e[1]), Count: 2})
	}
	return inv
}

// indexBlocks analyses inv and returns its blocks of size.
func indexBlocks(t *testing.T, inv *gpu.Inventory, size int) [][]int {
	t.Helper()
	nv, err := topology.AnalyzeNVLink("n", inv)
	if err != nil {
		t.Fatal(err)
	}
	return blocksOf(inv, nv, size)
}

func TestBlocksFollowTheGraphNotTheIndexes(t *testing.T) {
	// DGX-1 hybrid cube-mesh: two fully linked quads plus i <-> i+4.
	var cube [][2]int
	for _, q := range [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}} {
		for a := range q {
			for b := a + 1; b < len(q); b++ {
				cube = append(cube, [2]int{q[a], q[b]})
			}
		}
	}
	for i := range 4 {
		cube = append(cube, [2]int{i, i + 4})
	}
	// relabel maps the cube's GPU g to index p[g], as a board whose NVML
	// order does not follow the wiring would report it.
	relabel := func(edges [][2]int, p []int) [][2]int {
		out := make([][2]int, len(edges))
		for i, e := range edges {
			out[i] = [2]int{p[e[0]], p[e[1]]}
		}
		return out
	}
	perm := []int{5, 0, 7, 2, 1, 6, 3, 4} // quad {0,1,2,3} becomes {5,0,7,2}

	tests := map[string]struct {
		n     int
		edges [][2]int
		want  map[int][][]int
	}{
		// Bridged pairs in the order k8s-device-plugin issue 546 reports:
		// 0-2, 1-3, 4-5, 6-7. Aligned blocks would give GPUs 0-3 none.
		"bridged pairs, non-aligned": {
			n: 8, edges: [][2]int{{0, 2}, {1, 3}, {4, 5}, {6, 7}},
			want: map[int][][]int{2: {{0, 2}, {1, 3}, {4, 5}, {6, 7}}},
		},
		"cube mesh": {
			n: 8, edges: cube,
			want: map[int][][]int{2: {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, 4: {{0, 1, 2, 3}, {4, 5, 6, 7}}},
		},
		// The same wiring with permuted indexes: the quads are found where
		// the links put them, and pairs nest inside them.
		"cube mesh, permuted": {
			n: 8, edges: relabel(cube, perm),
			want: map[int][][]int{2: {{0, 2}, {1, 3}, {4, 6}, {5, 7}}, 4: {{0, 2, 5, 7}, {1, 3, 4, 6}}},
		},
		// Quads {0,2,4,6} and {1,3,5,7} joined by 0-1, 2-3, 4-5, 6-7: by
		// index alone the pairs would straddle the quads; they nest.
		"cube mesh, pairs nest in quads": {
			n: 8, edges: relabel(cube, []int{0, 2, 4, 6, 1, 3, 5, 7}),
			want: map[int][][]int{2: {{0, 2}, {1, 3}, {4, 6}, {5, 7}}, 4: {{0, 2, 4, 6}, {1, 3, 5, 7}}},
		},
		// A ring of four has no quad and exactly two disjoint pairs.
		"ring": {
			n: 4, edges: [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 0}},
			want: map[int][][]int{2: {{0, 1}, {2, 3}}},
		},
		// A path 0-1-2-3: greedy 1-2 would strand 0 and 3; the partition
		// keeps both pairs.
		"path": {
			n: 4, edges: [][2]int{{1, 2}, {0, 1}, {2, 3}},
			want: map[int][][]int{2: {{0, 1}, {2, 3}}},
		},
		// A triangle plus a pendant: one pair only, never two blocks
		// sharing a GPU.
		"odd": {
			n: 4, edges: [][2]int{{0, 1}, {1, 2}, {0, 2}, {2, 3}},
			want: map[int][][]int{2: {{0, 1}, {2, 3}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := map[int][][]int{}
			for _, s := range topology.BlockSizes {
				if b := indexBlocks(t, graphInventory(tc.n, tc.edges, nil), s); b != nil {
					got[s] = b
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("blocks (-want +got):\n%s", diff)
			}
			// Discovery order must not matter.
			rev := make([]int, tc.n)
			for i := range rev {
				rev[i] = tc.n - 1 - i
			}
			for _, s := range topology.BlockSizes {
				if diff := cmp.Diff(got[s], indexBlocks(t, graphInventory(tc.n, tc.edges, rev), s)); diff != "" {
					t.Errorf("size %d blocks depend on discovery order (-index order +reversed):\n%s", s, diff)
				}
			}
		})
	}
}

func TestBlocksOfALargeSwitchedNode(t *testing.T) {
	// 64 fully linked GPUs (the most a simulated profile may have) must
	// partition at once into 32 pairs, 16 quads and 8 eights.
	var edges [][2]int
	for a := range 64 {
		for b := a + 1; b < 64; b++ {
			edges = append(edges, [2]int{a, b})
		}
	}
	inv := graphInventory(64, edges, nil)
	for s, want := range map[int]int{2: 32, 4: 16, 8: 8} {
		if got := len(indexBlocks(t, inv, s)); got != want {
			t.Errorf("%d blocks of %d, want %d", got, s, want)
		}
	}
}

func TestLinksAreTheGPUsOwnCount(t *testing.T) {
	p, err := sim.LoadBuiltin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	nv, err := topology.AnalyzeNVLink("n", p.Inventory("n"))
	if err != nil {
		t.Fatal(err)
	}
	// An H100 has 18 NVLink 4 links of 25 GB/s per direction: 450 GB/s,
	// not 7 peers x 18.
	for i, g := range nv.GPUs {
		if g.Links != 18 || g.BandwidthGBps != 450 || g.Peers != 7 {
			t.Errorf("GPU %d: links=%d bandwidth=%d peers=%d, want 18, 450, 7", i, g.Links, g.BandwidthGBps, g.Peers)
		}
	}
}
