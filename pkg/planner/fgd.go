package planner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// A pod that asks for GPUs alone is placed by how much it fragments the
// GPUs it leaves, in the spirit of FGD (Weng et al., "Beware of
// Fragmentation", USENIX ATC'23): a free GPU, or a free part of a shared
// one, is a fragment for a kind of pod that cannot use it (too small a
// part, or on a node with too few whole GPUs left). A node's
// fragmentation is the free capacity the expected workload cannot use,
// weighted by how common each kind of pod is (the weights normalised, so
// it is the milliGPU an expected pod finds stranded); the pod goes to the
// node and GPU that raise it least. The workload is an estimate, so
// places whose rises differ by little count as equal, and the planner
// packs among them. For a pod with GPUs, places of equal integer score
// (FGDScore, FGD's own) are equal; among them the pod takes a node
// already in use before a free one, the first in the cluster's order
// (spine, leaf, node name), which fills leaf after leaf, and a free node
// from the leaf with the fewest free nodes, keeping whole leaves whole
// for multi-node jobs. For a pod without GPUs, placed by what its CPU
// and memory strand, places within fragTolerance of the least rise are
// equal, and it takes the node with the fewest free GPUs (then the leaf
// with the fewest free nodes), so it spends the CPU of nodes whose GPUs
// are already in use. Strategy consolidated packs instead (the fullest
// node and GPU that fit), distributed spreads (the emptiest). The
// allocator has the last word on every choice.

// fragTolerance is how far, in milliGPU of expected stranded compute (2 %
// of a GPU), a place's rise in fragmentation may lie above the least and
// still count as equal to it, for a pod without GPUs. Exact minima chase
// differences smaller than what the workload estimate can tell apart;
// packing among near equals leaves fuller nodes full and emptier ones
// whole. On the Alibaba trace this is worth about half a point of
// allocation at 130 % demand (docs/benchmarks.md); with the fullest node
// packed first, 10 and 40 gave less than 20 on the traces that chose it
// (gpushare80, cpu200).
const fragTolerance = 20

// WorkloadClass is one kind of pod of the expected workload.
type WorkloadClass struct {
	// GPUs per pod; MilliGPU per GPU: 1000 for whole GPUs, less for a
	// share of one GPU. A class of 0 GPUs (and 0 MilliGPU) is a pod
	// without GPUs: every free GPU is stranded for it, as FGD counts it.
	GPUs, MilliGPU int
	// Requests is what the pod asks of its node besides GPUs (cpu,
	// memory, ...); a node without that much left of its allocatable
	// strands all its free GPUs for the kind.
	Requests v1.ResourceList
	// NodeAffinity, when set, is where a pod of the kind may run (a GPU
	// model it asks for, say): every free GPU of a node it does not
	// match is stranded for the kind.
	NodeAffinity *v1.NodeSelector
	// Weight is how common the kind is; weights need not sum to 1.
	Weight float64
}

// Workload is the mix of pods fragmentation is measured against.
type Workload []WorkloadClass

// DefaultWorkload is used when the planner is given none: shares of a
// quarter and a half, and 1, 2, 4 and 8 whole GPUs.
func DefaultWorkload() Workload {
	return Workload{
		{GPUs: 1, MilliGPU: 250, Weight: 1}, {GPUs: 1, MilliGPU: 500, Weight: 1}, {GPUs: 1, MilliGPU: 1000, Weight: 2},
		{GPUs: 2, MilliGPU: 1000, Weight: 1}, {GPUs: 4, MilliGPU: 1000, Weight: 1}, {GPUs: 8, MilliGPU: 1000, Weight: 1},
	}
}

// Validate says what is wrong with a workload.
func (w Workload) Validate() error {
	sum := 0.0
	for _, c := range w {
		switch {
		case c.GPUs == 0 && c.MilliGPU == 0:
		case c.GPUs < 1 || c.MilliGPU < 1 || c.MilliGPU > topology.MilliPerGPU:
			return fmt.Errorf("workload class %+v: GPUs must be at least 1 and MilliGPU in 1..%d, or both 0", c, topology.MilliPerGPU)
		case c.MilliGPU < topology.MilliPerGPU && c.GPUs != 1:
			return fmt.Errorf("workload class %+v: only a one-GPU pod can ask for a share of a GPU", c)
		case c.Weight < 0 || math.IsNaN(c.Weight) || math.IsInf(c.Weight, 0):
			return fmt.Errorf("workload class %+v: weight must be a number of at least 0", c)
		}
		if c.NodeAffinity != nil {
			if _, err := nodeaffinity.NewNodeSelector(c.NodeAffinity); err != nil {
				return fmt.Errorf("workload class %+v: node affinity: %w", c, err)
			}
		}
		for name, q := range c.Requests {
			if q.Sign() < 0 {
				return fmt.Errorf("workload class %+v: request %s must not be negative", c, name)
			}
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
	name   string
	free   int // milliGPU
	shared bool
}

// gpuShape is a kind of GPU request: gpus whole GPUs, or a share.
type gpuShape struct{ gpus, milli int }

// fragModel is a workload prepared for scoring: its distinct GPU shapes,
// and each class's shape (-1 without GPUs), requests (by resource index,
// one pod slot included; nil where the cluster counts no resource) and
// node affinity (nil: every node).
type fragModel struct {
	w      Workload
	weight []float64 // by class, summing to 1
	shapes []gpuShape
	shape  []int     // by class
	req    [][]int64 // by class
	// sels are the distinct node affinities of the classes, selOf the
	// one of each class (-1: none), blockedBy the classes blocked on a
	// node by which of sels it matches (a bit each).
	sels      []*nodeaffinity.NodeSelector
	selOf     []int
	blockedBy map[uint64][]bool
}

func newFragModel(w Workload, res *resources) *fragModel {
	m := &fragModel{w: w, weight: make([]float64, len(w)), shape: make([]int, len(w)), req: make([][]int64, len(w)), selOf: make([]int, len(w)), blockedBy: map[uint64][]bool{}}
	selIdx := map[string]int{}
	sum := 0.0
	for _, c := range w {
		sum += c.Weight
	}
	for i, c := range w {
		m.weight[i] = c.Weight / sum
		if len(res.names) > 0 {
			m.req[i] = res.vector(c.Requests)
			m.req[i][res.idx[v1.ResourcePods]]++
		}
		m.selOf[i] = -1
		if c.NodeAffinity != nil {
			k := c.NodeAffinity.String()
			j, ok := selIdx[k]
			if !ok {
				j = len(m.sels)
				sel, _ := nodeaffinity.NewNodeSelector(c.NodeAffinity) // validated
				m.sels = append(m.sels, sel)
				selIdx[k] = j
			}
			m.selOf[i] = j
		}
		if c.GPUs == 0 {
			m.shape[i] = -1
			continue
		}
		k := gpuShape{c.GPUs, c.MilliGPU}
		j := slices.Index(m.shapes, k)
		if j < 0 {
			j = len(m.shapes)
			m.shapes = append(m.shapes, k)
		}
		m.shape[i] = j
	}
	return m
}

// fragStats is, per GPU shape, what a node's GPUs offer it: how many can
// take a pod of the shape (whole GPUs for whole-GPU shapes) and how much
// free compute no pod of the shape can use.
type fragStats struct {
	usable, stranded []int
	total            int
}

func (m *fragModel) stats(slots []slot) fragStats {
	s := fragStats{usable: make([]int, len(m.shapes)), stranded: make([]int, len(m.shapes))}
	for _, sl := range slots {
		m.change(&s, sl.free, sl.shared, 1)
	}
	return s
}

// change adds (sign 1) or removes (sign -1) a GPU with free milliGPU.
func (m *fragModel) change(s *fragStats, free int, shared bool, sign int) {
	s.total += sign * free
	for i, k := range m.shapes {
		ok := free == topology.MilliPerGPU
		if k.milli < topology.MilliPerGPU {
			ok = shared && free >= k.milli
		}
		if ok {
			s.usable[i] += sign
		} else {
			s.stranded[i] += sign * free
		}
	}
}

// blocked says, by class, whether a pod of the class may not run on
// node obj at all (nil when every class may run everywhere), and which
// of the distinct node affinities the node matches, which decides it;
// ok is false past 64 distinct affinities, when that does not fit.
func (m *fragModel) blocked(obj *v1.Node) (out []bool, matched uint64, ok bool) {
	if len(m.sels) == 0 {
		return nil, 0, true
	}
	for j, sel := range m.sels {
		if obj != nil && sel.Match(obj) && j < 64 {
			matched |= 1 << j
		}
	}
	if len(m.sels) <= 64 {
		if out, hit := m.blockedBy[matched]; hit {
			return out, matched, true
		}
	}
	out = make([]bool, len(m.w))
	for i, j := range m.selOf {
		out[i] = j >= 0 && (obj == nil || !m.sels[j].Match(obj))
	}
	if len(m.sels) > 64 {
		return out, 0, false
	}
	m.blockedBy[matched] = out
	return out, matched, true
}

// frag is the expected free compute the workload cannot use on a node
// with stats s, rest left of its allocatable (nil: not counted) and the
// classes blocked there (nil: none).
func (m *fragModel) frag(s *fragStats, rest []int64, blocked []bool) float64 {
	f := 0.0
	for i, c := range m.w {
		k := m.shape[i]
		if k < 0 || (blocked != nil && blocked[i]) || s.usable[k] < c.GPUs || !fits(m.req[i], rest) {
			f += m.weight[i] * float64(s.total)
		} else {
			f += m.weight[i] * float64(s.stranded[k])
		}
	}
	return f
}

// fits says whether req fits in rest; nothing is counted when either is
// nil.
func fits(req, rest []int64) bool {
	if req == nil || rest == nil {
		return true
	}
	for i, r := range req {
		if r > rest[i] {
			return false
		}
	}
	return true
}

func (s fragStats) clone() fragStats {
	return fragStats{usable: slices.Clone(s.usable), stranded: slices.Clone(s.stranded), total: s.total}
}

// podDemand is what a pod's GPU claims ask for: GPUs GPUs of MilliGPU.
type podDemand struct{ gpus, milli int }

// demand reads the pod's claims; ok is false for claims the scoring does
// not model (prioritized lists, "All", devices of other drivers), which
// the domain search places instead. A pod without claims is placed by
// fragmentation only when the cluster counts what nodes have left of
// their allocatable: its CPU and memory can strand a node's GPUs.
func (st *state) demand(pod Pod) (podDemand, bool) {
	var d podDemand
	if len(pod.Claims) == 0 {
		return d, len(st.c.res.names) > 0
	}
	for _, cl := range pod.Claims {
		for _, r := range cl.Spec.Devices.Requests {
			e := r.Exactly
			if e == nil || e.AllocationMode == resourceapi.DeviceAllocationModeAll || !st.gpuClass(e.DeviceClassName) || ptr.Deref(e.AdminAccess, false) {
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
func (st *state) gpuClass(name string) bool { return gpuClass(st.f.eval, name) }

func gpuClass(eval *devicefit.Evaluator, name string) bool {
	cl, err := eval.Classes.Get(name)
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

// slots lists node n's healthy GPUs and what is free of each, into buf.
func (st *state) slots(n int, buf []slot) []slot {
	nd := st.c.nodes[n]
	used := st.f.base.at(n)
	shares := st.f.shares.at(n)
	out := buf[:0]
	for _, g := range nd.healthyGPUs {
		s := slot{name: g.name, shared: g.shared}
		if !used.has(int(g.pos)) {
			s.free = topology.MilliPerGPU
		}
		if s.shared && s.free > 0 && shares != nil {
			if q := shares.consumed[nd.devs[g.pos]][topology.CapacityMilliGPU]; q != nil {
				s.free = max(s.free-int(q.Value()), 0)
			}
		}
		out = append(out, s)
	}
	return out
}

// choice is one place for the pod: a node and, for a share, its GPU.
type choice struct {
	node  int
	gpu   string // empty: the allocator picks the whole GPUs
	score float64
	// rise is the score before tolerance: the rise in fragmentation.
	rise float64
	left int // free milliGPU left on the node
	// gpuLeft is what the share leaves of its GPU: the fuller the better,
	// but for strategy distributed.
	gpuLeft int
	// leafFree counts the completely free nodes of the node's leaf: of
	// nodes with as much left, a pod goes to the leaf with the fewest,
	// keeping whole leaves free for multi-node jobs (but for strategy
	// distributed).
	leafFree int
	// inOrder: among places of equal score the node first in the
	// cluster's order wins (a pod with GPUs placed by fragmentation).
	inOrder bool
	// freeNode: every GPU of the node is free.
	freeNode bool
}

// better orders choices: lower score, then, for a pod with GPUs placed by
// fragmentation, a node in use before a free one, a free one from the
// leaf with fewer free nodes, then the node first in the cluster's order;
// else less left on the node, then the leaf with fewer free nodes, then
// the GPU the strategy prefers.
// The fullest node comes before the leaf: filling a node that is already
// in use never takes a free node from any leaf, and when only free nodes
// (or nodes as full) are left the leaf with the fewest free nodes gives
// one up. (For strategies consolidated and distributed the score is
// what is left, so the order of the two does not matter to them.)
func (c choice) better(o choice, spread bool) bool {
	switch {
	case c.score != o.score:
		return c.score < o.score
	case c.inOrder && c.freeNode != o.freeNode:
		return !c.freeNode
	case c.inOrder && c.freeNode && c.leafFree != o.leafFree:
		return c.leafFree < o.leafFree
	case c.inOrder && c.node != o.node:
		return c.node < o.node
	case c.left != o.left:
		return c.left < o.left
	case c.leafFree != o.leafFree && !spread:
		return c.leafFree < o.leafFree
	case spread:
		return c.gpuLeft > o.gpuLeft
	}
	return c.gpuLeft < o.gpuLeft
}

// planOnePod places a one-pod job of GPU claims by fragmentation (or by
// packing or spreading, per strategy). ok is false when the job is not
// such a job, or no node may take it whatever its GPUs, or no choice the
// scoring offers passes the allocator: the domain search then decides
// and explains.
func (st *state) planOnePod() (*Plan, bool, error) {
	job := st.job
	if st.n != 1 || job.Placement != PlacementAuto || len(job.Pinned) > 0 || job.Domain != nil || job.PreferredDomain != "" || st.apart != nil || st.together != nil || st.spread != nil || st.portsHeld != nil {
		return nil, false, nil
	}
	// The scoring models each node's own GPUs; GPUs that nodes share
	// are for the domain search.
	if st.c.shared.gpus.intersects(st.f.nlUsable) {
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
	m := newFragModel(w, &st.c.res)
	spread := job.Strategy == StrategyDistributed
	sh := st.podShape[0]
	bufp := choicePool.Get().(*[]choice)
	choices := (*bufp)[:0] // the best of each node
	defer func() {
		*bufp = choices[:0]
		choicePool.Put(bufp)
	}()
	var buf []slot
	freeNodes := make([]int, len(st.c.leaves)) // by leaf
	scores := map[scoreKey]memoScore{}
	open := 0 // nodes the pod may use, whatever their GPUs
	for n, nd := range st.c.nodes {
		if st.filters[sh].why[n] != "" || st.room(sh, n, nil, 1) == 0 {
			continue
		}
		open++
		buf = st.slots(n, buf)
		free := allFree(buf)
		if free && nd.leaf != nil {
			freeNodes[nd.leaf.idx]++
		}
		blocked, matched, keyed := m.blocked(nd.obj)
		key, memo := st.scoreKey(n, buf, d, matched)
		memo = memo && keyed
		if memo {
			if v, hit := scores[key]; hit {
				if v.found {
					v.c.node = n
					v.c.freeNode = free
					choices = append(choices, v.c)
				}
				continue
			}
		}
		c, found := st.score(n, buf, d, m, spread, blocked)
		if memo {
			scores[key] = memoScore{c, found}
		}
		if found {
			c.freeNode = free
			choices = append(choices, c)
		}
	}
	for i := range choices {
		if l := st.c.nodes[choices[i].node].leaf; l != nil {
			choices[i].leafFree = freeNodes[l.idx]
		}
	}
	if job.Strategy != StrategyConsolidated && !spread {
		nearEqual(choices)
	}
	if len(choices) == 0 && open > 0 {
		// The GPUs are what is missing; the domain search would ask the
		// allocator on every node to say the same.
		return nil, true, &Unschedulable{Job: job.Key, Reason: fmt.Sprintf("no node has room for %s: %s the pod may use have too little free", st.demandDesc(d), plural(open, "node")), Filtered: st.filtered(nil)}
	}
	const tries = 16
	for _, c := range bestChoices(choices, tries, spread) {
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

// choicePool keeps the buffers planOnePod lists every node's choice in:
// one per plan would be the largest allocation of a one-pod plan.
var choicePool = sync.Pool{New: func() any { return new([]choice) }}

// bestChoices returns the k best choices in the order better gives, ties
// in the order of choices (as a stable sort would put them), without
// sorting them all.
func bestChoices(choices []choice, k int, spread bool) []choice {
	top := make([]choice, 0, k)
	for _, c := range choices {
		i := len(top)
		for i > 0 && c.better(top[i-1], spread) {
			i--
		}
		if i == k {
			continue
		}
		if len(top) < k {
			top = append(top, choice{})
		}
		copy(top[i+1:], top[i:len(top)-1])
		top[i] = c
	}
	return top
}

// nearEqual makes places of nearly equal rise in fragmentation equal, so
// the tie-breaks decide among them: for a pod with GPUs, places of equal
// FGDScore; for a pod without, places within fragTolerance of the least
// rise.
func nearEqual(choices []choice) {
	if len(choices) > 0 && choices[0].inOrder {
		for i := range choices {
			choices[i].score = -float64(FGDScore(choices[i].rise))
		}
		return
	}
	least := math.Inf(1)
	for _, c := range choices {
		least = min(least, c.score)
	}
	for i := range choices {
		if choices[i].score <= least+fragTolerance {
			choices[i].score = least
		}
	}
}

// FGDScore is FGD's score of a rise in fragmentation (milliGPU per
// expected pod), int(100 × sigmoid(−rise / 1000)): 50 for no change, one
// point about 40 milliGPU wide near it and wider as the rise grows. It is
// the artifact's NodeGpuShareFragAmountScore (hkust-adsl/kubernetes-
// scheduler-simulator, fgd_score.go), with its arithmetic, so that the
// replay's transcription of the artifact (pkg/simulate) scores as it
// does. How coarse it is, is what the rule rests on: on the Alibaba
// traces FGD's figures need the coarse score and a fixed order among
// equal scores (docs/benchmarks.md).
func FGDScore(rise float64) int64 {
	return int64(1.0 / (1.0 + math.Exp(rise/1000)) * 100)
}

// allFree says whether every GPU of a node is free.
func allFree(slots []slot) bool {
	for _, s := range slots {
		if s.free < topology.MilliPerGPU {
			return false
		}
	}
	return len(slots) > 0
}

// rest is what node n has left of its allocatable before and after the
// job's pod takes its requests; nil where the node's is not counted.
func (st *state) rest(n int) (before, after []int64) {
	nd := st.c.nodes[n]
	if nd.alloc == nil {
		return nil, nil
	}
	req := st.f.shapes[st.podShape[0]].needs.req
	before, after = make([]int64, len(nd.alloc)), make([]int64, len(nd.alloc))
	for i, a := range nd.alloc {
		before[i] = a - at(st.resBase.at(n), i)
		after[i] = before[i] - at(req, i)
	}
	return before, after
}

// scoreKey is everything score reads of a node for whole GPUs: what is
// free of each GPU, which are shared, and what is left of its allocatable.
// Nodes with equal keys get equal choices, so a plan scores each key once.
//
// Its fields leave no padding, so the map hashes and compares it as one
// block of memory.
type scoreKey struct {
	rest [4]int64
	// matched has a bit per distinct node affinity of the workload the
	// node matches: what decides the classes it rules out.
	matched uint64
	free    [16]int16
	shared  uint32
	slots   uint16
	res     uint16 // resources in rest; noRest: the node's are not checked
}

const noRest = 0xff

type memoScore struct {
	c     choice
	found bool
}

// scoreMemo lets planOnePod score alike nodes once; tests turn it off to
// compare.
var scoreMemo = true

// scoreKey returns node n's key, or false when its choice cannot be
// shared: a share names its GPU, and keys hold up to 16 GPUs and 4
// resources.
func (st *state) scoreKey(n int, slots []slot, d podDemand, matched uint64) (scoreKey, bool) {
	nd := st.c.nodes[n]
	if !scoreMemo || (d.gpus > 0 && d.milli < topology.MilliPerGPU) || len(slots) > 16 || len(nd.alloc) > 4 {
		return scoreKey{}, false
	}
	k := scoreKey{slots: uint16(len(slots)), res: noRest, matched: matched}
	for i, sl := range slots {
		k.free[i] = int16(sl.free)
		if sl.shared {
			k.shared |= 1 << i
		}
	}
	if nd.alloc != nil {
		k.res = uint16(len(nd.alloc))
		for i, a := range nd.alloc {
			k.rest[i] = a - at(st.resBase.at(n), i)
		}
	}
	return k, true
}

// score finds the best place on node n (slots: its GPUs) for the job's
// pod of demand d; lower scores are better.
func (st *state) score(n int, slots []slot, d podDemand, m *fragModel, spread bool, blocked []bool) (choice, bool) {
	rest, after := st.rest(n)
	stats := m.stats(slots)
	var before float64
	if st.job.Strategy != StrategyConsolidated && !spread {
		before = m.frag(&stats, rest, blocked)
	}
	best, found := choice{}, false
	consider := func(gpu string, gpuLeft int, s fragStats) {
		c := choice{node: n, gpu: gpu, left: s.total, gpuLeft: gpuLeft}
		switch {
		case st.job.Strategy == StrategyConsolidated:
			c.score = float64(s.total)
		case spread:
			c.score = -float64(s.total)
		default:
			c.score = m.frag(&s, after, blocked) - before
			c.rise = c.score
			c.inOrder = d.gpus > 0
		}
		if !found || c.better(best, spread) {
			best, found = c, true
		}
	}
	if d.gpus == 0 {
		consider("", 0, stats)
		return best, true
	}
	if d.milli < topology.MilliPerGPU {
		for _, sl := range slots {
			if !sl.shared || sl.free < d.milli {
				continue
			}
			s := stats.clone()
			m.change(&s, sl.free, true, -1)
			m.change(&s, sl.free-d.milli, true, 1)
			consider(sl.name, sl.free-d.milli, s)
		}
		return best, found
	}
	// Whole GPUs: the allocator takes the first free ones.
	s := stats.clone()
	taken := 0
	for _, sl := range slots {
		if taken < d.gpus && sl.free == topology.MilliPerGPU {
			m.change(&s, sl.free, sl.shared, -1)
			m.change(&s, 0, sl.shared, 1)
			taken++
		}
	}
	if taken == d.gpus {
		consider("", 0, s)
	}
	return best, found
}

func (st *state) demandDesc(d podDemand) string {
	if d.gpus == 0 {
		return "a pod without GPUs"
	}
	if d.milli < topology.MilliPerGPU {
		return fmt.Sprintf("%d milliGPU of a shared GPU", d.milli)
	}
	return plural(d.gpus, "whole GPU")
}

// confirm allocates the pod's claims on the chosen node; a share only on
// the chosen GPU. nil results: the allocator says no.
func (st *state) confirm(c choice, pod Pod) ([]resourceapi.AllocationResult, error) {
	nd := st.c.nodes[c.node]
	if len(pod.Claims) == 0 {
		return []resourceapi.AllocationResult{}, nil
	}
	slices, err := st.c.slicesFor(nd)
	if err != nil {
		return nil, err
	}
	if c.gpu != "" {
		slices = OnlyDevice(slices, c.gpu)
	}
	st.f.runs++
	results, err := st.f.eval.AllocateOn(st.f.ctx, nd.obj, slices, st.f.state(c.node, st.f.base.at(c.node), taken{}, nil), pod.Claims)
	if err != nil {
		if ctxErr := st.f.ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, &BrokenClaimError{Job: st.job.Key, Pod: pod.Name, Node: nd.name, Err: err}
	}
	return results, nil
}

// OnlyDevice keeps, of gputopo's devices in the slices, the named one
// (a place chosen on one GPU, for the allocator to confirm); other
// drivers' slices stay whole.
func OnlyDevice(in []*resourceapi.ResourceSlice, device string) []*resourceapi.ResourceSlice {
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
		Requests:    NodeUsage{},
		Reasons:     slices.Clone(st.reasons), AllocatorRuns: st.f.runs,
	}
	p.Requests.addRequests(node, pod.Requests)
	where := node
	if c.gpu != "" {
		where = node + " " + c.gpu
	}
	what := st.demandDesc(d)
	nodes := plural(candidates, "node")
	switch st.job.Strategy {
	case StrategyConsolidated:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s on %s: the fullest place of %s with room (strategy consolidated), %d milliGPU left there", what, where, nodes, c.left))
	case StrategyDistributed:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s on %s: the emptiest place of %s with room (strategy distributed), %d milliGPU left there", what, where, nodes, c.left))
	default:
		equal := fmt.Sprintf("within %d of the least", fragTolerance)
		if c.inOrder {
			equal = fmt.Sprintf("FGD score %d, packed among the places of that score: nodes in use first", FGDScore(c.rise))
		}
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s on %s: of %s with room, it strands the least free GPU compute for the expected workload (%+.0f milliGPU per expected pod, %s), %d milliGPU left there", what, where, nodes, c.rise, equal, c.left))
	}
	return p
}
