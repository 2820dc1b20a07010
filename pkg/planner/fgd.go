package planner

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/topology"
)

// A pod that asks for GPUs alone is placed by how much it fragments the
// GPUs it leaves, in the spirit of FGD (Weng et al., "Beware of
// Fragmentation", USENIX ATC'23): a free GPU, or a free part of a shared
// one, is a fragment for a kind of pod that cannot use it (too small a
// part, or on a node with too few whole GPUs left). A node's
// fragmentation is the free capacity the expected workload cannot use,
// weighted by how common each kind of pod is; the pod goes to the node
// and GPU that raise it least. Strategy consolidated packs instead (the
// fullest node and GPU that fit), distributed spreads (the emptiest).
// The allocator has the last word on every choice.

// WorkloadClass is one kind of pod of the expected workload.
type WorkloadClass struct {
	// GPUs per pod; MilliGPU per GPU: 1000 for whole GPUs, less for a
	// share of one GPU.
	GPUs, MilliGPU int
	// Weight is how common the kind is; weights need not sum to 1.
	Weight float64
}

// Workload is the mix of pods fragmentation is measured against.
type Workload []WorkloadClass

// DefaultWorkload is used when the planner is given none: shares of a
// quarter and a half, and 1, 2, 4 and 8 whole GPUs.
func DefaultWorkload() Workload {
	return Workload{{1, 250, 1}, {1, 500, 1}, {1, 1000, 2}, {2, 1000, 1}, {4, 1000, 1}, {8, 1000, 1}}
}

// Validate says what is wrong with a workload.
func (w Workload) Validate() error {
	sum := 0.0
	for _, c := range w {
		switch {
		case c.GPUs < 1 || c.MilliGPU < 1 || c.MilliGPU > topology.MilliPerGPU:
			return fmt.Errorf("workload class %+v: GPUs must be at least 1 and MilliGPU in 1..%d", c, topology.MilliPerGPU)
		case c.MilliGPU < topology.MilliPerGPU && c.GPUs != 1:
			return fmt.Errorf("workload class %+v: only a one-GPU pod can ask for a share of a GPU", c)
		case c.Weight < 0 || math.IsNaN(c.Weight) || math.IsInf(c.Weight, 0):
			return fmt.Errorf("workload class %+v: weight must be a number of at least 0", c)
		}
		sum += c.Weight
	}
	if sum <= 0 {
		return errors.New("the workload has no class of weight above 0")
	}
	return nil
}

// Option configures a Planner.
type Option func(*Planner)

// WithWorkload measures fragmentation against w instead of the default;
// a workload that does not validate keeps the default.
func WithWorkload(w Workload) Option {
	return func(p *Planner) {
		if w.Validate() == nil {
			p.workload = slices.Clone(w)
		}
	}
}

// slot is one healthy GPU of a node with what is free of it.
type slot struct {
	pos    int
	name   string
	free   int // milliGPU
	shared bool
}

// fragStats is, per workload class, what a node's GPUs offer it: how many
// can take a pod of the class (whole GPUs for whole-GPU classes) and how
// much free capacity no pod of the class can use.
type fragStats struct {
	usable, stranded []int
	total            int
}

func newFragStats(w Workload, slots []slot) fragStats {
	s := fragStats{usable: make([]int, len(w)), stranded: make([]int, len(w))}
	for _, sl := range slots {
		s.change(w, sl.free, sl.shared, 1)
	}
	return s
}

// change adds (sign 1) or removes (sign -1) a GPU with free milliGPU.
func (s *fragStats) change(w Workload, free int, shared bool, sign int) {
	s.total += sign * free
	for i, c := range w {
		ok := free == topology.MilliPerGPU
		if c.MilliGPU < topology.MilliPerGPU {
			ok = shared && free >= c.MilliGPU
		}
		if ok {
			s.usable[i] += sign
		} else {
			s.stranded[i] += sign * free
		}
	}
}

// frag is the expected free capacity the workload cannot use.
func (s *fragStats) frag(w Workload) float64 {
	f := 0.0
	for i, c := range w {
		if s.usable[i] < c.GPUs {
			f += c.Weight * float64(s.total)
		} else {
			f += c.Weight * float64(s.stranded[i])
		}
	}
	return f
}

// podDemand is what a pod's GPU claims ask for: GPUs GPUs of MilliGPU.
type podDemand struct{ gpus, milli int }

// demand reads the pod's claims; ok is false for claims the scoring does
// not model (prioritized lists, "All", devices of other drivers), which
// the domain search places instead.
func (st *state) demand(pod Pod) (podDemand, bool) {
	var d podDemand
	for _, cl := range pod.Claims {
		for _, r := range cl.Spec.Devices.Requests {
			e := r.Exactly
			if e == nil || e.AllocationMode == resourceapi.DeviceAllocationModeAll || !st.gpuClass(e.DeviceClassName) {
				return d, false
			}
			milli := topology.MilliPerGPU
			if e.Capacity != nil {
				if q, ok := e.Capacity.Requests[topology.CapacityMilliGPU]; ok {
					milli = int(q.Value())
				}
			}
			if d.gpus > 0 && milli != d.milli {
				return d, false
			}
			d.gpus += int(max(e.Count, 1))
			d.milli = milli
		}
	}
	if d.gpus == 0 || d.milli < 1 || d.milli > topology.MilliPerGPU || (d.milli < topology.MilliPerGPU && d.gpus > 1) {
		return d, false
	}
	return d, true
}

// gpuClass says whether a DeviceClass selects gputopo's GPUs.
func (st *state) gpuClass(name string) bool {
	cl, err := st.f.eval.Classes.Get(name)
	if err != nil {
		return false
	}
	for _, s := range cl.Spec.Selectors {
		if s.CEL != nil && strings.Contains(s.CEL.Expression, `"`+topology.DriverName+`"`) {
			return true
		}
	}
	return false
}

// slots lists node n's healthy GPUs and what is free of each.
func (st *state) slots(n int) []slot {
	nd := st.c.nodes[n]
	used := st.f.base[n]
	var shares *nodeShares
	if st.f.shares != nil {
		shares = st.f.shares[n]
	}
	var out []slot
	pos := 0
	for _, sl := range nd.slices {
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			p := pos
			pos++
			if sl.Spec.Driver != topology.DriverName || !nd.healthy.has(p) {
				continue
			}
			s := slot{pos: p, name: d.Name, shared: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations}
			switch {
			case used.has(p):
			case s.shared:
				s.free = topology.MilliPerGPU
				if shares != nil {
					if q := shares.consumed[nd.devs[p]][topology.CapacityMilliGPU]; q != nil {
						s.free -= int(q.Value())
					}
				}
				s.free = max(s.free, 0)
			default:
				s.free = topology.MilliPerGPU
			}
			out = append(out, s)
		}
	}
	return out
}

// choice is one place for the pod: a node and, for a share, its GPU.
type choice struct {
	node  int
	gpu   string // empty: the allocator picks the whole GPUs
	score float64
	left  int // free milliGPU left on the node
	// gpuLeft is what the share leaves of its GPU: the fuller the better,
	// but for strategy distributed.
	gpuLeft int
}

// planOnePod places a one-pod job of GPU claims by fragmentation (or by
// packing or spreading, per strategy). ok is false when the job is not
// such a job, or no choice the scoring offers passes the allocator: the
// domain search then decides, and explains a refusal.
func (st *state) planOnePod() (*Plan, bool, error) {
	job := st.job
	if st.n != 1 || job.Placement != PlacementAuto || len(job.Pinned) > 0 || job.Domain != nil || job.PreferredDomain != "" {
		return nil, false, nil
	}
	pod := job.Pods[0]
	d, ok := st.demand(pod)
	if !ok {
		return nil, false, nil
	}
	w := st.workload
	if len(w) == 0 {
		w = DefaultWorkload()
	}
	var choices []choice
	for n, nd := range st.c.nodes {
		if !nd.schedulable || (job.NodeFits != nil && !job.NodeFits(pod.Name, nd.name)) {
			continue
		}
		choices = append(choices, st.score(n, d, w)...)
	}
	spread := job.Strategy == StrategyDistributed
	slices.SortStableFunc(choices, func(a, b choice) int {
		if c := cmp.Compare(a.score, b.score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.left, b.left); c != 0 {
			return c
		}
		if spread {
			return cmp.Compare(b.gpuLeft, a.gpuLeft)
		}
		return cmp.Compare(a.gpuLeft, b.gpuLeft)
	})
	const tries = 32
	for i, c := range choices {
		if i == tries {
			break
		}
		results, err := st.confirm(c, pod)
		if err != nil {
			return nil, true, err
		}
		if results != nil {
			return st.onePodPlan(c, pod, results, d, len(choices)), true, nil
		}
	}
	return nil, false, nil
}

// score lists the places on node n for a pod of demand d, scored by the
// strategy: lower is better.
func (st *state) score(n int, d podDemand, w Workload) []choice {
	slots := st.slots(n)
	stats := newFragStats(w, slots)
	before := stats.frag(w)
	var out []choice
	add := func(gpu string, gpuLeft int, after fragStats) {
		c := choice{node: n, gpu: gpu, left: after.total, gpuLeft: gpuLeft}
		switch st.job.Strategy {
		case StrategyConsolidated:
			c.score = float64(after.total)
		case StrategyDistributed:
			c.score = -float64(after.total)
		default:
			c.score = after.frag(w) - before
		}
		out = append(out, c)
	}
	if d.milli < topology.MilliPerGPU {
		for _, sl := range slots {
			if !sl.shared || sl.free < d.milli {
				continue
			}
			after := stats.clone()
			after.change(w, sl.free, true, -1)
			after.change(w, sl.free-d.milli, true, 1)
			add(sl.name, sl.free-d.milli, after)
		}
		return out
	}
	// Whole GPUs: the allocator takes the first free ones.
	after := stats.clone()
	taken := 0
	for _, sl := range slots {
		if taken < d.gpus && sl.free == topology.MilliPerGPU {
			after.change(w, sl.free, sl.shared, -1)
			after.change(w, 0, sl.shared, 1)
			taken++
		}
	}
	if taken == d.gpus {
		add("", 0, after)
	}
	return out
}

func (s fragStats) clone() fragStats {
	return fragStats{usable: slices.Clone(s.usable), stranded: slices.Clone(s.stranded), total: s.total}
}

// confirm allocates the pod's claims on the chosen node; a share only on
// the chosen GPU. nil results: the allocator says no.
func (st *state) confirm(c choice, pod Pod) ([]resourceapi.AllocationResult, error) {
	nd := st.c.nodes[c.node]
	slices := nd.slices
	if c.gpu != "" {
		slices = only(nd.slices, c.gpu)
	}
	st.f.runs++
	results, err := st.f.eval.AllocateOn(st.f.ctx, nd.obj, slices, st.f.state(c.node, st.f.base[c.node], nil), pod.Claims)
	if err != nil {
		if ctxErr := st.f.ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, &BrokenClaimError{Job: st.job.Key, Pod: pod.Name, Node: nd.name, Err: err}
	}
	return results, nil
}

// only keeps, of gputopo's devices, the named one.
func only(in []*resourceapi.ResourceSlice, device string) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, 0, len(in))
	for _, sl := range in {
		if sl.Spec.Driver != topology.DriverName {
			out = append(out, sl)
			continue
		}
		cp := *sl
		cp.Spec.Devices = nil
		for _, d := range sl.Spec.Devices {
			if d.Name == device {
				cp.Spec.Devices = append(cp.Spec.Devices, d)
			}
		}
		out = append(out, &cp)
	}
	return out
}

func (st *state) onePodPlan(c choice, pod Pod, results []resourceapi.AllocationResult, d podDemand, candidates int) *Plan {
	node := st.c.nodes[c.node].name
	p := &Plan{
		Job: st.job.Key, Domain: Domain{Level: LevelNode, Names: []string{node}},
		Assignments: map[string]string{pod.Name: node},
		Allocations: map[string][]resourceapi.AllocationResult{pod.Name: results},
		Reasons:     slices.Clone(st.reasons), AllocatorRuns: st.f.runs,
	}
	where := node
	if c.gpu != "" {
		where = node + " " + c.gpu
	}
	what := fmt.Sprintf("%s milliGPU", fmt.Sprint(d.milli))
	if d.milli == topology.MilliPerGPU {
		what = plural(d.gpus, "whole GPU")
	}
	switch st.job.Strategy {
	case StrategyConsolidated:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s on %s: the fullest of %s that fit (strategy consolidated), %d milliGPU left there", what, where, plural(candidates, "place"), c.left))
	case StrategyDistributed:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s on %s: the emptiest of %s that fit (strategy distributed), %d milliGPU left there", what, where, plural(candidates, "place"), c.left))
	default:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s on %s: of %s that fit, it strands the least free GPU capacity for the expected workload (+%.0f milliGPU), %d milliGPU left there", what, where, plural(candidates, "place"), c.score, c.left))
	}
	return p
}
