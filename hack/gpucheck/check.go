package main

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

// report collects what was compared.
type report struct {
	lines      []string
	mismatches int
}

func (r *report) ok(format string, a ...any) {
	r.lines = append(r.lines, "ok: "+fmt.Sprintf(format, a...))
}
func (r *report) skip(format string, a ...any) {
	r.lines = append(r.lines, "not checked: "+fmt.Sprintf(format, a...))
}
func (r *report) bad(format string, a ...any) {
	r.mismatches++
	r.lines = append(r.lines, "MISMATCH: "+fmt.Sprintf(format, a...))
}

// facts are the independent sources the published devices are checked
// against.
type facts struct {
	smi   []smiGPU
	cuda  string         // from nvidia-smi's banner
	topo  [][]int        // nvidia-smi topo -m, nil when unavailable
	links map[string]int // active links by UUID (nvidia-smi nvlink --status), nil when unavailable
	sysfs string         // root of /sys
}

// compare checks every published device against the facts.
func compare(pub []published, f facts) *report {
	r := &report{}
	byUUID := map[string]published{}
	for _, p := range pub {
		byUUID[p.UUID] = p
	}
	for _, g := range f.smi {
		p, ok := byUUID[g.UUID]
		if !ok {
			r.bad("GPU %d (%s, %s) is not published; the plugin log says why (MIG mode, lost, ...)", g.Index, g.UUID, g.BusID)
			continue
		}
		delete(byUUID, g.UUID)
		compareGPU(r, p, g, f)
	}
	for _, p := range byUUID {
		r.bad("%s (%s) is published but nvidia-smi does not list it", p.Name, p.UUID)
	}
	compareNVLink(r, pub, f)
	return r
}

func compareGPU(r *report, p published, g smiGPU, f facts) {
	name := fmt.Sprintf("%s (nvidia-smi GPU %d)", p.Name, g.Index)
	check := func(what string, got, want any) {
		if got == want {
			r.ok("%s %s %v", name, what, got)
		} else {
			r.bad("%s %s: published %v, the machine says %v", name, what, got, want)
		}
	}
	check("bus ID", p.BusID, g.BusID)
	check("memory MiB", p.MemoryBytes>>20, g.MemMiB)
	check("driver version", p.Driver, semver(g.Driver))
	if f.cuda != "" {
		check("CUDA version", p.CUDA, semver(f.cuda))
	}

	dev := filepath.Join(f.sysfs, "bus/pci/devices", g.BusID)
	if root, err := pcieRoot(dev); err != nil {
		r.bad("%s PCIe root: %v", name, err)
	} else {
		check("PCIe root", p.PCIeRoot, root)
	}
	numa, err := readInt(filepath.Join(dev, "numa_node"))
	switch {
	case err != nil:
		r.bad("%s NUMA node: %v", name, err)
	case numa < 0 && p.NUMANode != nil:
		r.bad("%s NUMA node: published %d, sysfs says none", name, *p.NUMANode)
	case numa < 0:
		r.ok("%s NUMA node: none, as sysfs says", name)
	case p.NUMANode == nil:
		r.bad("%s NUMA node: not published, sysfs says %d", name, numa)
	default:
		check("NUMA node", *p.NUMANode, int64(numa))
	}
	if n, ok := f.links[g.UUID]; ok {
		check("active NVLinks", p.Links, int64(n))
	}
}

var pciRootRE = regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`)

// pcieRoot follows the sysfs link of a PCI device to its root complex,
// e.g. ../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0 -> pci0000:17.
func pcieRoot(dev string) (string, error) {
	target, err := os.Readlink(dev)
	if err != nil {
		return "", fmt.Errorf("read sysfs link: %w", err)
	}
	for _, part := range strings.Split(filepath.ToSlash(target), "/") {
		if pciRootRE.MatchString(part) {
			return part, nil
		}
	}
	return "", fmt.Errorf("no PCI root in %s", target)
}

func readInt(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// semver spells a version the way version attributes do: "535.183.01" is
// 535.183.1, "12.4" is 12.4.0.
func semver(v string) string {
	parts := strings.Split(strings.TrimSpace(v), ".")
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if n, err := strconv.Atoi(p); err == nil {
			parts[i] = strconv.Itoa(n)
		}
	}
	return strings.Join(parts, ".")
}

// compareNVLink checks the published NVLink domains, blocks and peers
// against nvidia-smi topo -m, which reads the links independently of NVML's
// per-link queries the plugin makes.
func compareNVLink(r *report, pub []published, f facts) {
	if len(f.smi) < 2 {
		r.skip("NVLink: this machine has %d GPU; NVLink needs two, nothing can be said about it", len(f.smi))
		return
	}
	if f.topo == nil {
		r.skip("NVLink: no nvidia-smi topo -m output")
		return
	}
	if len(f.topo) != len(f.smi) {
		r.bad("nvidia-smi topo -m lists %d GPUs, nvidia-smi %d", len(f.topo), len(f.smi))
		return
	}
	// topo -m is by nvidia-smi index; map it to published devices by UUID.
	byUUID := map[string]published{}
	for _, p := range pub {
		byUUID[p.UUID] = p
	}
	inv := &gpu.Inventory{LinkBandwidthGBps: 1}
	var devs []published // by nvidia-smi index order, published ones only
	for _, g := range f.smi {
		if p, ok := byUUID[g.UUID]; ok {
			inv.Devices = append(inv.Devices, gpu.Device{Index: g.Index})
			devs = append(devs, p)
		}
	}
	linked := func(a, b int) bool { return f.topo[a][b] > 0 || f.topo[b][a] > 0 }
	for a := range f.smi {
		for b := a + 1; b < len(f.smi); b++ {
			if linked(a, b) {
				inv.Links = append(inv.Links, gpu.Link{A: f.smi[a].Index, B: f.smi[b].Index, Count: max(f.topo[a][b], f.topo[b][a])})
			}
		}
	}
	inv.Links = slices.DeleteFunc(inv.Links, func(l gpu.Link) bool {
		return !slices.ContainsFunc(inv.Devices, func(d gpu.Device) bool { return d.Index == l.A }) ||
			!slices.ContainsFunc(inv.Devices, func(d gpu.Device) bool { return d.Index == l.B })
	})
	want, err := topology.AnalyzeNVLink("check", inv)
	if err != nil {
		r.bad("NVLink graph of nvidia-smi topo -m: %v", err)
		return
	}
	if len(inv.Links) == 0 {
		r.ok("NVLink: nvidia-smi topo -m shows none between published GPUs")
	}
	for i, p := range devs {
		idx := inv.Devices[i].Index
		if int64(want.GPUs[i].Peers) != p.Peers {
			r.bad("%s NVLink peers: published %d, nvidia-smi topo -m shows %d", p.Name, p.Peers, want.GPUs[i].Peers)
		} else {
			r.ok("%s NVLink peers %d", p.Name, p.Peers)
		}
		for j, q := range devs {
			if j <= i {
				continue
			}
			sameDomain := p.Domain != "" && p.Domain == q.Domain
			if sameDomain != (want.GPUs[i].Domain != "" && want.GPUs[i].Domain == want.GPUs[j].Domain) {
				r.bad("%s and %s: same NVLink domain published %v, nvidia-smi topo -m says %v", p.Name, q.Name, sameDomain, !sameDomain)
			}
			for _, s := range topology.BlockSizes {
				if id := p.Blocks[s]; id != "" && id == q.Blocks[s] && !linked(idx, inv.Devices[j].Index) {
					r.bad("%s and %s share nvlinkBlock%d but nvidia-smi topo -m shows no NVLink between them", p.Name, q.Name, s)
				}
			}
		}
	}
	for _, s := range topology.BlockSizes {
		got, exp := countBlocks(devs, func(i int) string { return devs[i].Blocks[s] }), countBlocks(devs, func(i int) string { return want.GPUs[i].Blocks[s] })
		if got != exp {
			r.bad("nvlinkBlock%d: %d blocks published, nvidia-smi topo -m allows %d", s, got, exp)
		} else {
			r.ok("nvlinkBlock%d: %d blocks", s, got)
		}
	}
}

func countBlocks(devs []published, id func(int) string) int {
	seen := map[string]bool{}
	for i := range devs {
		if v := id(i); v != "" {
			seen[v] = true
		}
	}
	return len(seen)
}

// checkCDISpec checks that every host path a CDI spec names exists: device
// nodes, mounts and hook programs.
func checkCDISpec(r *report, paths []string) {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				r.bad("CDI spec names %s, which does not exist", p)
			} else {
				r.bad("CDI spec names %s: %v", p, err)
			}
			continue
		}
		r.ok("CDI spec path %s exists", p)
	}
}

// cdiEdits are the path-bearing parts of CDI container edits.
type cdiEdits struct {
	nodes  []*cdispec.DeviceNode
	mounts []*cdispec.Mount
	hooks  []*cdispec.Hook
}

func (e *cdiEdits) hostPaths() []string {
	var out []string
	for _, n := range e.nodes {
		out = append(out, cmp.Or(n.HostPath, n.Path))
	}
	for _, m := range e.mounts {
		out = append(out, m.HostPath)
	}
	for _, h := range e.hooks {
		out = append(out, h.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
