package scale

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/demo/specs"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

// LeafTemplate is the demo template with a leaf CEL selector. Pods of the
// topology workload that use it get a copy per leaf, round robin over the
// cluster's leaves, so each asks for "four GPUs under leaf X".
const LeafTemplate = "gpu-4-leaf"

// leafInDemo is the leaf the demo's LeafTemplate selects.
const leafInDemo = `"leaf-0"`

// countTemplate is the demo's count-only claim (one GPU, no selector or
// constraint); the count-only workload uses copies with other counts.
const countTemplate = "gpu-1"

// Labels of the benchmark's pods.
const (
	LabelWorkload = "bench.gputopo.dev/workload"
	claimName     = "gpus"
)

// Weighted is one entry of a mix: a name (a template, a Job shape) and how
// often it occurs relative to the others.
type Weighted struct {
	Name   string
	Weight int
}

// ParseMix parses "a=2,b=1,c" (weight 1 when omitted).
func ParseMix(s string) ([]Weighted, error) {
	var out []Weighted
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, found := strings.Cut(part, "=")
		weight := 1
		if found {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("mix entry %q: the weight after = must be a whole number of at least 1", part)
			}
			weight = n
		}
		if seen[name] {
			return nil, fmt.Errorf("mix entry %q: %s is listed twice", part, name)
		}
		seen[name] = true
		out = append(out, Weighted{Name: name, Weight: weight})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("mix %q is empty: list entries as name=weight, separated by commas", s)
	}
	return out, nil
}

// Sequence returns n names drawn from the mix in a fixed interleaved order:
// each cycle takes every entry Weight times, spread over the cycle.
func Sequence(mix []Weighted, n int) []string {
	maxW := 0
	for _, m := range mix {
		maxW = max(maxW, m.Weight)
	}
	var cycle []string
	for round := range maxW {
		for _, m := range mix {
			if round < m.Weight {
				cycle = append(cycle, m.Name)
			}
		}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = cycle[i%len(cycle)]
	}
	return out
}

// ClaimGPUs is how many devices a claim template asks for; only exact
// counts can be compared with a count-only claim.
func ClaimGPUs(t *resourcev1.ResourceClaimTemplate) (int, error) {
	total := 0
	for _, r := range t.Spec.Spec.Devices.Requests {
		if r.Exactly == nil {
			return 0, fmt.Errorf("template %s: request %s has no exactly: only exact requests have a GPU count", t.Name, r.Name)
		}
		if r.Exactly.AllocationMode != "" && r.Exactly.AllocationMode != resourcev1.DeviceAllocationModeExactCount {
			return 0, fmt.Errorf("template %s: request %s uses allocation mode %s: only ExactCount has a GPU count", t.Name, r.Name, r.Exactly.AllocationMode)
		}
		total += int(max(r.Exactly.Count, 1))
	}
	if total == 0 {
		return 0, fmt.Errorf("template %s requests no devices", t.Name)
	}
	return total, nil
}

// LeafNodeSelector is a mix entry for comparison, not a demo template: a
// count-only claim for four GPUs in a pod whose nodeSelector names the
// leaf, round robin over the leaves like LeafTemplate.
const LeafNodeSelector = "gpu-4-leaf-nodeselector"

// PodPlan is the pods of one workload, in creation order: the template of
// each pod's claim and, where the pod has one, the leaf its nodeSelector
// names. Templates holds every template they use.
type PodPlan struct {
	Workload  string
	Templates []*resourcev1.ResourceClaimTemplate
	Pods      []string
	Leaves    []string
	GPUs      int
}

func (p *PodPlan) add(template, leaf string, gpus int) {
	p.Pods = append(p.Pods, template)
	p.Leaves = append(p.Leaves, leaf)
	p.GPUs += gpus
}

// TopologyAndCount returns the two workloads of the throughput benchmark:
// n pods whose claims use the demo's topology templates in the mix (the
// leaf template spread over leaves), and n pods asking for the same GPU
// counts, pod by pod, with count-only claims.
func TopologyAndCount(mix []Weighted, n int, leaves []string) (topo, count PodPlan, err error) {
	topo, count = PodPlan{Workload: "topology"}, PodPlan{Workload: "count"}
	base, err := specs.ClaimTemplate(countTemplate)
	if err != nil {
		return topo, count, err
	}
	counts := map[int]*resourcev1.ResourceClaimTemplate{}
	countOf := func(gpus int) (string, error) {
		if counts[gpus] == nil {
			t, err := withCount(base, gpus)
			if err != nil {
				return "", err
			}
			counts[gpus] = t
			count.Templates = append(count.Templates, t)
		}
		return counts[gpus].Name, nil
	}
	gpusOf := map[string]int{LeafNodeSelector: 4}
	perLeaf := map[string]string{}
	for _, m := range mix {
		if m.Name == LeafNodeSelector {
			if len(leaves) == 0 {
				return topo, count, fmt.Errorf("mix entry %s needs leaves, and the cluster has none", m.Name)
			}
			continue
		}
		t, err := specs.ClaimTemplate(m.Name)
		if err != nil {
			return topo, count, fmt.Errorf("mix entry %s: %w (the mix lists demo/specs/claims templates or %s)", m.Name, err, LeafNodeSelector)
		}
		if gpusOf[m.Name], err = ClaimGPUs(t); err != nil {
			return topo, count, err
		}
		if m.Name != LeafTemplate {
			topo.Templates = append(topo.Templates, t)
			continue
		}
		if len(leaves) == 0 {
			return topo, count, fmt.Errorf("mix entry %s needs leaves, and the cluster has none", m.Name)
		}
		for _, leaf := range leaves {
			lt, err := forLeaf(t, leaf)
			if err != nil {
				return topo, count, err
			}
			perLeaf[leaf] = lt.Name
			topo.Templates = append(topo.Templates, lt)
		}
	}
	leafTurn := 0
	for _, name := range Sequence(mix, n) {
		gpus := gpusOf[name]
		countName, err := countOf(gpus)
		if err != nil {
			return topo, count, err
		}
		switch name {
		case LeafTemplate:
			topo.add(perLeaf[leaves[leafTurn%len(leaves)]], "", gpus)
			leafTurn++
		case LeafNodeSelector:
			topo.add(countName, leaves[leafTurn%len(leaves)], gpus)
			leafTurn++
		default:
			topo.add(name, "", gpus)
		}
		count.add(countName, "", gpus)
	}
	return topo, count, nil
}

func countName(gpus int) string { return "gpu-count-" + strconv.Itoa(gpus) }

// withCount is the count-only demo template asking for gpus devices.
func withCount(base *resourcev1.ResourceClaimTemplate, gpus int) (*resourcev1.ResourceClaimTemplate, error) {
	d := base.Spec.Spec.Devices
	if len(d.Requests) != 1 || d.Requests[0].Exactly == nil || len(d.Requests[0].Exactly.Selectors) > 0 || len(d.Constraints) > 0 {
		return nil, fmt.Errorf("demo template %s is no longer one count-only request; the count-only workload needs one", base.Name)
	}
	t := base.DeepCopy()
	t.ObjectMeta = metav1.ObjectMeta{Name: countName(gpus)}
	t.Spec.Spec.Devices.Requests[0].Exactly.Count = int64(gpus)
	return t, nil
}

// forLeaf is the leaf template selecting leaf instead of the demo's leaf.
func forLeaf(base *resourcev1.ResourceClaimTemplate, leaf string) (*resourcev1.ResourceClaimTemplate, error) {
	t := base.DeepCopy()
	t.ObjectMeta = metav1.ObjectMeta{Name: base.Name + "-" + leaf}
	replaced := 0
	for i := range t.Spec.Spec.Devices.Requests {
		ex := t.Spec.Spec.Devices.Requests[i].Exactly
		if ex == nil {
			continue
		}
		for j := range ex.Selectors {
			if c := ex.Selectors[j].CEL; c != nil && strings.Contains(c.Expression, leafInDemo) {
				c.Expression = strings.ReplaceAll(c.Expression, leafInDemo, strconv.Quote(leaf))
				replaced++
			}
		}
	}
	if replaced == 0 {
		return nil, fmt.Errorf("demo template %s has no CEL selector comparing with %s; update the benchmark's leaf substitution", base.Name, leafInDemo)
	}
	return t, nil
}

// NewPod is a benchmark pod with one claim from the template, on the
// leaf when leaf is set.
func NewPod(name, workload, template, leaf string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{LabelWorkload: workload}},
		Spec:       podSpec(template),
	}
	if leaf != "" {
		pod.Spec.NodeSelector = map[string]string{cluster.LabelLeaf: leaf}
	}
	return pod
}

// podSpec is a benchmark pod that does nothing, with one claim from
// template, or none when template is empty.
func podSpec(template string) corev1.PodSpec {
	spec := corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Containers:                    []corev1.Container{{Name: "work", Image: "registry.k8s.io/pause:3.10"}},
	}
	if template != "" {
		spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: claimName}}
		spec.ResourceClaims = []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: ptr.To(template)}}
	}
	return spec
}
