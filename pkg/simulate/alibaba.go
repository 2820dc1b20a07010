package simulate

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/pkg/clustertopo"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
)

// LineError is a bad row of an input file.
type LineError struct {
	File string
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// csvFile reads a CSV file whose first row names the columns.
type csvFile struct {
	name string
	r    *csv.Reader
	cols map[string]int
}

// newCSV reads rows of any length; '#' starts a comment line.
func newCSV(r io.Reader, name string, cols map[string]int) *csvFile {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	return &csvFile{name: name, r: cr, cols: cols}
}

func openCSV(r io.Reader, name string, required ...string) (*csvFile, error) {
	f := newCSV(r, name, map[string]int{})
	cr := f.r
	head, err := cr.Read()
	if err != nil {
		return nil, f.wrap(err, 1)
	}
	for i, h := range head {
		f.cols[strings.TrimSpace(h)] = i
	}
	for _, col := range required {
		if _, ok := f.cols[col]; !ok {
			line, _ := cr.FieldPos(0)
			return nil, &LineError{File: name, Line: line, Err: fmt.Errorf("header %q lacks column %q", strings.Join(head, ","), col)}
		}
	}
	return f, nil
}

// rows yields each row with its line. A read error ends the rows and is
// left in *errp.
func (f *csvFile) rows(errp *error) iter.Seq2[[]string, int] {
	return func(yield func([]string, int) bool) {
		for {
			rec, err := f.r.Read()
			if err == io.EOF {
				return
			}
			if err != nil {
				*errp = f.wrap(err, 0) // a csv.ParseError knows its line
				return
			}
			line, _ := f.r.FieldPos(0)
			if !yield(rec, line) {
				return
			}
		}
	}
}

func (f *csvFile) wrap(err error, line int) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		line = pe.Line
	}
	if err == io.EOF {
		err = errors.New("the file is empty: it needs a header row")
	}
	return &LineError{File: f.name, Line: line, Err: err}
}

// int reads column col of rec as an integer in [lo, hi].
func (f *csvFile) int(rec []string, col string, lo, hi int) (int, error) {
	i := f.cols[col]
	if i >= len(rec) {
		return 0, fmt.Errorf("%s is missing: the row has %d fields", col, len(rec))
	}
	v, err := strconv.Atoi(strings.TrimSpace(rec[i]))
	if err != nil {
		return 0, fmt.Errorf("%s %q is not an integer", col, rec[i])
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%s %d is out of range %d..%d", col, v, lo, hi)
	}
	return v, nil
}

// nodeResources reads the optional cpu_milli and memory_mib columns of a
// node or a pod; a file without them says nothing (0).
func (f *csvFile) nodeResources(rec []string) (cpu, mem int64, err error) {
	for _, c := range []struct {
		col string
		v   *int64
	}{{"cpu_milli", &cpu}, {"memory_mib", &mem}} {
		if _, ok := f.cols[c.col]; !ok {
			continue
		}
		v, err := f.int(rec, c.col, 0, 1<<40)
		if err != nil {
			return 0, 0, err
		}
		*c.v = int64(v)
	}
	return cpu, mem, nil
}

func (f *csvFile) str(rec []string, col string) string {
	if i, ok := f.cols[col]; ok && i < len(rec) {
		return strings.TrimSpace(rec[i])
	}
	return ""
}

// LabelGPUModel is the node label that names the GPU model of an Alibaba
// node, as the trace's cluster labels it; a pod's gpu_spec selects on it.
const LabelGPUModel = "alibabacloud.com/gpu-card-model"

// ParseAlibabaNodes reads an Alibaba GPU v2023 node list
// (sn,cpu_milli,memory_mib,gpu,model). Every GPU count and model gets a
// synthetic PCIe-only profile (see AlibabaProfile) and the model as
// LabelGPUModel; nodes without GPUs are kept for the CPU and memory they
// offer, when the list gives them and g.GPUNodesOnly is not set, and
// skipped otherwise. Consecutive nodes kept share a leaf.
func ParseAlibabaNodes(r io.Reader, name string, g Grouping) ([]NodeSpec, error) {
	if g.NodesPerLeaf < 1 || g.LeavesPerSpine < 1 {
		return nil, fmt.Errorf("nodes per leaf and leaves per spine must be at least 1, got %d and %d", g.NodesPerLeaf, g.LeavesPerSpine)
	}
	f, err := openCSV(r, name, "sn", "gpu", "model")
	if err != nil {
		return nil, err
	}
	profiles := map[string]*sim.Profile{}
	var out []NodeSpec
	var readErr error
	for rec, line := range f.rows(&readErr) {
		bad := func(err error) error { return &LineError{File: name, Line: line, Err: err} }
		sn := f.str(rec, "sn")
		if sn == "" {
			return nil, bad(errors.New("sn (the node name) is empty"))
		}
		gpus, err := f.int(rec, "gpu", 0, 64)
		if err != nil {
			return nil, bad(err)
		}
		cpu, mem, err := f.nodeResources(rec)
		if err != nil {
			return nil, bad(err)
		}
		var p *sim.Profile
		var labels map[string]string
		switch {
		case gpus == 0 && (cpu == 0 || g.GPUNodesOnly):
			continue
		case gpus > 0:
			model := f.str(rec, "model")
			labels = map[string]string{LabelGPUModel: model}
			key := fmt.Sprintf("%s/%d", model, gpus)
			if p = profiles[key]; p == nil {
				if p, err = AlibabaProfile(model, gpus); err != nil {
					return nil, bad(err)
				}
				profiles[key] = p
			}
		}
		leaf := len(out) / g.NodesPerLeaf
		out = append(out, NodeSpec{
			Name:     strings.ToLower(sn),
			Leaf:     clustertopo.LeafName(leaf),
			Spine:    clustertopo.SpineName(leaf / g.LeavesPerSpine),
			Profile:  p,
			Labels:   labels,
			CPUMilli: cpu, MemoryMiB: mem,
		})
	}
	if readErr != nil {
		return nil, readErr
	}
	if !slices.ContainsFunc(out, func(n NodeSpec) bool { return n.Profile != nil }) {
		return nil, fmt.Errorf("%s lists no node with GPUs", name)
	}
	return out, nil
}

// alibabaModels are the GPU models of the Alibaba trace that are public;
// G2 and G3 are anonymised there and get neutral values.
var alibabaModels = map[string]struct {
	product, arch, cc, memory string
}{
	"P100":    {"Tesla P100-PCIE-16GB", "pascal", "6.0", "16Gi"},
	"T4":      {"Tesla T4", "turing", "7.5", "16Gi"},
	"V100M16": {"Tesla V100-16GB", "volta", "7.0", "16Gi"},
	"V100M32": {"Tesla V100-32GB", "volta", "7.0", "32Gi"},
	"A10":     {"NVIDIA A10", "ampere", "8.6", "24Gi"},
}

// AlibabaProfile is the synthetic node of the Alibaba trace with gpus
// GPUs of model. It has no NVLink: the trace says nothing about links,
// and its pods ask for a GPU count only (claims like gpu-1 with count N),
// which no link changes. Unknown or anonymised models (G2, G3) get
// "unknown" product data and 32Gi.
func AlibabaProfile(model string, gpus int) (*sim.Profile, error) {
	m, ok := alibabaModels[model]
	if !ok {
		m.product, m.arch, m.cc, m.memory = "Alibaba "+model, "unknown", "7.0", "32Gi"
	}
	numa := 1
	if gpus >= 4 {
		numa = 2
	}
	roots := max(1, gpus/2)
	name := strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, fmt.Sprintf("alibaba-%s-%dg", model, gpus)), "-")
	doc := fmt.Sprintf(`name: %s
productName: %q
architecture: %s
cudaComputeCapability: %q
driverVersion: "535.183.01"
cudaDriverVersion: "12.2"
memory: %s
linkBandwidthGBps: 0
gpus: %d
numaNodes: %d
pcieRoots: %d
`, name, m.product, m.arch, m.cc, m.memory, gpus, numa, roots)
	p, err := sim.ParseProfile([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("synthetic profile for %d × %q: %w", gpus, model, err)
	}
	return p, nil
}

// ParseAlibabaPods reads an Alibaba GPU v2023 pod list
// (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]). Every GPU
// pod is a one-pod job in trace order; a pod without GPUs is one too, for
// the CPU and memory it takes, when the list gives them. A pod asking for
// a share of one GPU (num_gpu 1, gpu_milli < 1000) is Shared. gpu_spec,
// when given, lists the GPU models the pod may use, separated by '|'
// (Job.GPUModels; empty: any).
func ParseAlibabaPods(r io.Reader, name string) (*Trace, error) {
	f, err := openCSV(r, name, "name", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	tr := &Trace{Format: FormatAlibaba, Source: name}
	seen := map[string]int{}
	var readErr error
	for rec, line := range f.rows(&readErr) {
		bad := func(err error) error { return &LineError{File: name, Line: line, Err: err} }
		pod := f.str(rec, "name")
		if pod == "" {
			return nil, bad(errors.New("name is empty"))
		}
		if prev, dup := seen[pod]; dup {
			return nil, bad(fmt.Errorf("pod %s is listed twice (first on line %d)", pod, prev))
		}
		seen[pod] = line
		gpus, err := f.int(rec, "num_gpu", 0, 64)
		if err != nil {
			return nil, bad(err)
		}
		if gpus == 0 {
			j := Job{Name: pod, Pods: 1}
			if j.CPUMilli, j.MemoryMiB, err = f.nodeResources(rec); err != nil {
				return nil, bad(err)
			}
			if j.CPUMilli > 0 || j.MemoryMiB > 0 {
				tr.Jobs = append(tr.Jobs, j)
				tr.CPUOnlyPods++
			}
			continue
		}
		milli, err := f.int(rec, "gpu_milli", 1, 1000)
		if err != nil {
			return nil, bad(err)
		}
		if milli < 1000 && gpus > 1 {
			return nil, bad(fmt.Errorf("gpu_milli %d with num_gpu %d: only a one-GPU pod can ask for a share of a GPU", milli, gpus))
		}
		j := Job{Name: pod, Pods: 1, GPUsPerPod: gpus, MilliGPU: gpus * milli}
		if milli < 1000 {
			j.Shared = true
			tr.SharedPods++
		}
		for m := range strings.SplitSeq(f.str(rec, "gpu_spec"), "|") {
			if m = strings.TrimSpace(m); m != "" && !slices.Contains(j.GPUModels, m) {
				j.GPUModels = append(j.GPUModels, m)
			}
		}
		if len(j.GPUModels) > 0 {
			tr.ModelPods++
		}
		if j.CPUMilli, j.MemoryMiB, err = f.nodeResources(rec); err != nil {
			return nil, bad(err)
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	if readErr != nil {
		return nil, readErr
	}
	if len(tr.Jobs) == tr.CPUOnlyPods {
		return nil, fmt.Errorf("%s lists no pod with GPUs", name)
	}
	return tr, nil
}

// sortedCounts renders a histogram as "1:3911 2:16".
func sortedCounts(m map[int]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d:%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
