package topology_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/topology"
)

// blocksOf groups GPU indexes by their block ID of the given size.
func blocksOf(nv *topology.NodeNVLink, size int) [][]int {
	byID := map[string][]int{}
	var order []string
	for i, g := range nv.GPUs {
		id, ok := g.Blocks[size]
		if !ok {
			continue
		}
		if _, seen := byID[id]; !seen {
			order = append(order, id)
		}
		byID[id] = append(byID[id], i)
	}
	var out [][]int
	for _, id := range order {
		out = append(out, byID[id])
	}
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
			nv, err := topology.AnalyzeNVLink("node-a", p.Inventory("node-a"))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(w.domains, nv.Domains); diff != "" {
				t.Errorf("domains (-want +got):\n%s", diff)
			}
			got := map[int][][]int{}
			for _, s := range topology.BlockSizes {
				if b := blocksOf(nv, s); b != nil {
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
	if diff := cmp.Diff([][]int{{0, 1}}, blocksOf(nv, 2)); diff != "" {
		t.Errorf("pairs (-want +got):\n%s", diff)
	}
	if b := blocksOf(nv, 4); b != nil {
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
