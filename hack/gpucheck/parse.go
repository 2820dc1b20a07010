package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/topology"
)

// published is one device as the plugin's ResourceSlices show it.
type published struct {
	Name        string
	Index       int
	UUID        string
	BusID       string
	PCIeRoot    string
	NUMANode    *int64
	MemoryBytes int64
	Driver      string
	CUDA        string
	Product     string
	Domain      string
	Blocks      map[int]string
	Peers       int64
	Links       int64
}

// parseSlices reads the YAML stream of --print-resource-slices.
func parseSlices(data []byte) ([]published, error) {
	var out []published
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read ResourceSlices: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict(doc, &s); err != nil {
			return nil, fmt.Errorf("decode ResourceSlice: %w", err)
		}
		for _, d := range s.Spec.Devices {
			out = append(out, fromDevice(d))
		}
	}
}

func fromDevice(d resourceapi.Device) published {
	p := published{Name: d.Name, Blocks: map[int]string{}}
	attr := func(name string) resourceapi.DeviceAttribute {
		return d.Attributes[resourceapi.QualifiedName(name)]
	}
	str := func(name string) string {
		if v := attr(name).StringValue; v != nil {
			return *v
		}
		return ""
	}
	num := func(name string) int64 {
		if v := attr(name).IntValue; v != nil {
			return *v
		}
		return 0
	}
	ver := func(name string) string {
		if v := attr(name).VersionValue; v != nil {
			return *v
		}
		return ""
	}
	p.Index = int(num(topology.AttrIndex))
	p.UUID = str(topology.AttrUUID)
	p.BusID = str("resource.kubernetes.io/pciBusID")
	p.PCIeRoot = str("resource.kubernetes.io/pcieRoot")
	numa := attr("resource.kubernetes.io/numaNode")
	switch {
	case numa.IntValue != nil:
		p.NUMANode = numa.IntValue
	case len(numa.IntValues) > 0:
		p.NUMANode = &numa.IntValues[0]
	}
	if q, ok := d.Capacity[topology.CapacityMemory]; ok {
		p.MemoryBytes = q.Value.Value()
	}
	p.Driver = ver(topology.AttrDriverVersion)
	p.CUDA = ver(topology.AttrCUDADriverVersion)
	p.Product = str(topology.AttrProductName)
	p.Domain = str(topology.AttrNVLinkDomain)
	for _, s := range topology.BlockSizes {
		if id := str(topology.BlockAttr(s)); id != "" {
			p.Blocks[s] = id
		}
	}
	p.Peers = num(topology.AttrNVLinkPeers)
	p.Links = num(topology.AttrNVLinkLinks)
	return p
}

// smiGPU is one line of nvidia-smi --query-gpu=index,uuid,pci.bus_id,
// memory.total,driver_version,name --format=csv,noheader,nounits.
type smiGPU struct {
	Index  int
	UUID   string
	BusID  string
	MemMiB int64
	Driver string
	Name   string
}

func parseSMIQuery(data []byte) ([]smiGPU, error) {
	r := csv.NewReader(bytes.NewReader(data))
	r.TrimLeadingSpace = true
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read nvidia-smi query: %w", err)
	}
	var out []smiGPU
	for _, row := range rows {
		if len(row) < 6 {
			return nil, fmt.Errorf("nvidia-smi query line %q: want 6 fields", strings.Join(row, ","))
		}
		idx, err := strconv.Atoi(row[0])
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi query index %q: %w", row[0], err)
		}
		mem, err := strconv.ParseInt(row[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi memory.total %q: %w", row[3], err)
		}
		out = append(out, smiGPU{Index: idx, UUID: row[1], BusID: normaliseBusID(row[2]), MemMiB: mem, Driver: row[4], Name: strings.Join(row[5:], ",")})
	}
	return out, nil
}

var cudaRE = regexp.MustCompile(`CUDA Version:\s*([0-9]+\.[0-9]+)`)

// parseCUDAVersion reads "CUDA Version: 12.4" from nvidia-smi's banner.
func parseCUDAVersion(data []byte) (string, error) {
	m := cudaRE.FindSubmatch(data)
	if m == nil {
		return "", errors.New("no \"CUDA Version\" in nvidia-smi output")
	}
	return string(m[1]), nil
}

// ansiRE matches the terminal escapes nvidia-smi writes even into a file
// (`topo -m` underlines its header: "\x1b[4mGPU0 ... \x1b[0m").
var ansiRE = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// parseTopo reads the GPU block of `nvidia-smi topo -m`: lanes[i][j] is
// the # of an NV# entry (0 for X, PIX, SYS, ...), by nvidia-smi index.
func parseTopo(data []byte) ([][]int, error) {
	lines := strings.Split(ansiRE.ReplaceAllString(string(data), ""), "\n")
	var header []string
	start := 0
	for k, l := range lines {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "GPU0" {
			header, start = f, k+1
			break
		}
	}
	if header == nil {
		return nil, errors.New("no GPU0 column in nvidia-smi topo -m output")
	}
	n := 0
	for _, h := range header {
		if h == fmt.Sprintf("GPU%d", n) {
			n++
		}
	}
	lanes := make([][]int, n)
	seen := 0
	for _, l := range lines[start:] {
		f := strings.Fields(l)
		if len(f) < n+1 || !strings.HasPrefix(f[0], "GPU") {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(f[0], "GPU"))
		if err != nil || i >= n || lanes[i] != nil {
			continue
		}
		lanes[i] = make([]int, n)
		for j := range n {
			if c, ok := strings.CutPrefix(f[1+j], "NV"); ok {
				if k, err := strconv.Atoi(c); err == nil {
					lanes[i][j] = k
				}
			}
		}
		seen++
	}
	if seen != n {
		return nil, fmt.Errorf("nvidia-smi topo -m: %d GPU columns but %d GPU rows", n, seen)
	}
	return lanes, nil
}

var (
	nvlinkGPURE  = regexp.MustCompile(`^GPU \d+:.*\(UUID: (GPU-[0-9a-fA-F-]+)\)`)
	nvlinkLinkRE = regexp.MustCompile(`^\s+Link \d+: (.*)$`)
)

// parseNVLinkStatus counts each GPU's active links in `nvidia-smi nvlink
// --status` (a link reads "<inactive>" when it is down).
func parseNVLinkStatus(data []byte) map[string]int {
	out := map[string]int{}
	uuid := ""
	for _, l := range strings.Split(string(data), "\n") {
		if m := nvlinkGPURE.FindStringSubmatch(l); m != nil {
			uuid = m[1]
			out[uuid] += 0
			continue
		}
		if m := nvlinkLinkRE.FindStringSubmatch(l); m != nil && uuid != "" && !strings.Contains(m[1], "inactive") {
			out[uuid]++
		}
	}
	return out
}

// normaliseBusID maps nvidia-smi's "00000000:18:00.0" to sysfs's
// "0000:18:00.0".
func normaliseBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	domain, rest, ok := strings.Cut(s, ":")
	if !ok || !strings.Contains(rest, ":") {
		return s
	}
	n, err := strconv.ParseUint(domain, 16, 64)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", n, rest)
}
