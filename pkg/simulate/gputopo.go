package simulate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// placer is one scheduler under test. It places every pod of a job or
// none and keeps what it placed until release.
type placer interface {
	name() string
	// place places j, which has waited so long (timed traces).
	place(ctx context.Context, key string, j Job, waited time.Duration) (placement, error)
	release(key string)
	usage() planner.Usage
}

type placement struct {
	ok    bool
	nodes []int // by pod
	// inDomain: the job lies within the domain its size rule asks for.
	inDomain bool
	// partial: some pods fit but not all (the pod schedulers roll them
	// back; a scheduler without gangs would hold their GPUs meanwhile).
	partial bool
	runs    int // allocator runs
}

// requiredLeaves is the size rule: one leaf for up to a leaf's worth of
// pods, then as many adjacent leaves as the pods need nodes.
func (c *Cluster) requiredLeaves(pods int) int {
	if c.NodesPerLeaf == 0 {
		return 1
	}
	return (pods + c.NodesPerLeaf - 1) / c.NodesPerLeaf
}

// modelSelector selects the nodes of the given GPU models; nil for any.
func modelSelector(models []string) *v1.NodeSelector {
	if len(models) == 0 {
		return nil
	}
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
		{Key: LabelGPUModel, Operator: v1.NodeSelectorOpIn, Values: slices.Clone(models)},
	}}}}
}

// modelAffinity is the required node affinity of a pod that may use the
// given GPU models only, as a user would write it; nil for any.
func modelAffinity(models []string) *v1.NodeAffinity {
	if sel := modelSelector(models); sel != nil {
		return &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: sel}
	}
	return nil
}

// shareOf is the share of a GPU one pod of j takes, 0 for whole GPUs: a
// shared pod takes its share only where GPUs are shared.
func shareOf(j Job, sharing bool) int {
	if j.Shared && sharing {
		return j.MilliGPU
	}
	return 0
}

func podClaims(cl *Claims, name string, j Job, sharing bool) []*resourceapi.ResourceClaim {
	if j.GPUsPerPod == 0 {
		return nil
	}
	return []*resourceapi.ResourceClaim{cl.claim(name+"-gpu", j.GPUsPerPod, shareOf(j, sharing))}
}

// gputopoPlacer plans every job with the planner, exactly as the
// controller does, and holds the plan's devices, shares and requests as a
// reservation. Jobs without GPUs that the default scheduler places hold
// their requests the same way, so the planner sees every node's CPU and
// memory in use against its allocatable.
//
// Snapshots are immutable and every plan walks all reservations, so
// placed jobs are folded into a fresh snapshot every commitEvery jobs
// (and after a departure from it): what is in use stays exactly the
// same, only less of it is reservations.
type gputopoPlacer struct {
	c        *Cluster
	claims   *Claims
	p        *planner.Planner
	strategy planner.Strategy
	snap     *planner.Snapshot
	res      *planner.Reservations // jobs placed since the last commit
	// committed are the jobs folded into snap.
	committed map[string]planner.Reservation
	stale     bool // a committed job left: snap must be rebuilt
	cpu       *ledger
	pods      map[string][]hold // CPU and memory held, by job
	// cpuOnly places pods without GPUs, as the default scheduler does in
	// a cluster with gputopo, unless allPods: then they opt in to
	// gputopo's placement too. It sees the CPU and memory gputopo's pods
	// take.
	cpuOnly *podScheduler
	allPods bool
	// A multi-node job of a timed trace that the planner can only place
	// beyond its size-rule domain waits for one, up to maxWait (no limit
	// when negative).
	timed   bool
	maxWait time.Duration
}

const commitEvery = 64

func newGputopo(c *Cluster, cl *Claims, opt Options, w planner.Workload, seed uint64, timed bool) *gputopoPlacer {
	g := &gputopoPlacer{allPods: opt.CPUPodsOptIn, strategy: opt.Strategy,
		c: c, claims: cl, p: planner.New(cl.evaluator(), planner.WithWorkload(w)),
		snap: planner.NewSnapshot(c.Planner, nil), res: planner.NewReservations(), committed: map[string]planner.Reservation{},
		cpu: newLedger(c), pods: map[string][]hold{},
	}
	g.cpuOnly = newSchedulerModel(c, cl, seed, g.cpu)
	g.timed, g.maxWait = timed, opt.MaxDomainWait
	return g
}

func (g *gputopoPlacer) name() string { return "gputopo" }

func (g *gputopoPlacer) place(ctx context.Context, key string, j Job, waited time.Duration) (placement, error) {
	g.commit(false)
	if j.GPUsPerPod == 0 && !g.allPods {
		out, err := g.cpuOnly.place(ctx, key, j, waited)
		if err != nil || !out.ok {
			return out, err
		}
		return out, g.holdRequests(key, j, out.nodes)
	}
	job := planner.Job{Key: key, Strategy: g.strategy}
	for i := range j.Pods {
		name := fmt.Sprintf("%s-%d", key, i)
		job.Pods = append(job.Pods, planner.Pod{Name: name, Claims: podClaims(g.claims, name, j, g.c.Sharing),
			Requests: requests(j.CPUMilli, j.MemoryMiB), NodeAffinity: modelAffinity(j.GPUModels)})
	}
	plan, err := g.p.Plan(ctx, g.snap, g.res, job)
	var refused *planner.Unschedulable
	if errors.As(err, &refused) {
		return placement{}, nil
	}
	if err != nil {
		return placement{}, fmt.Errorf("plan job %s: %w", key, err)
	}
	out := placement{ok: true, runs: plan.AllocatorRuns, nodes: make([]int, len(job.Pods))}
	if span, ok := g.domainLeaves(plan.Domain); ok {
		out.inDomain = span <= g.c.requiredLeaves(j.Pods)
	}
	if j.Pods > 1 && !out.inDomain && g.timed && (g.maxWait < 0 || waited < g.maxWait) {
		return placement{runs: plan.AllocatorRuns}, nil
	}
	if err := g.res.Add(plan.Reservation()); err != nil {
		return placement{}, fmt.Errorf("hold the devices of job %s: %w", key, err)
	}
	for i, pod := range job.Pods {
		n, ok := g.c.Node(plan.Assignments[pod.Name])
		if !ok {
			return placement{}, fmt.Errorf("plan of job %s puts pod %s on unknown node %q", key, pod.Name, plan.Assignments[pod.Name])
		}
		out.nodes[i] = n
		h := hold{node: n, cpu: j.CPUMilli, mem: j.MemoryMiB}
		g.cpuOnly.takeScored(h, j, 1)
		g.pods[key] = append(g.pods[key], h)
	}
	return out, nil
}

// holdRequests reserves what the pods of a job the default scheduler
// placed on nodes take from their allocatable.
func (g *gputopoPlacer) holdRequests(key string, j Job, nodes []int) error {
	r := planner.Reservation{Job: key, Pods: map[string]string{}, Requests: planner.NodeUsage{}}
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{Requests: requests(j.CPUMilli, j.MemoryMiB)}}}}}
	for i, n := range nodes {
		node := g.c.Nodes[n].Name
		r.Pods[fmt.Sprintf("%s-%d", key, i)] = node
		r.Requests.Add(node, pod)
	}
	if err := g.res.Add(r); err != nil {
		return fmt.Errorf("hold the requests of job %s: %w", key, err)
	}
	return nil
}

// commit folds the reservations into a new snapshot when there are
// enough of them, or when force is set, and rebuilds a stale snapshot.
func (g *gputopoPlacer) commit(force bool) {
	jobs := g.res.Jobs()
	if !g.stale && len(jobs) < commitEvery && !(force && len(jobs) > 0) {
		return
	}
	for _, job := range jobs {
		r, _ := g.res.Get(job)
		g.committed[job] = r
		g.res.Remove(job)
	}
	st := devicefit.NewState()
	var used []planner.SnapshotOption
	for _, r := range g.committed {
		for _, ids := range r.Devices {
			st.Devices.Insert(ids...)
		}
		for _, shares := range r.Shares {
			for _, sh := range shares {
				st.AddShare(sh)
			}
		}
		used = append(used, planner.WithUsed(r.Requests))
	}
	g.snap, g.stale = planner.NewSnapshotFromState(g.c.Planner, st, used...), false
}

// domainLeaves is how many adjacent leaves the planner's domain spans.
func (g *gputopoPlacer) domainLeaves(d planner.Domain) (int, bool) {
	switch d.Level {
	case planner.LevelNode:
		n, ok := g.c.Node(d.Names[0])
		return 1, ok && g.c.Nodes[n].Leaf != ""
	case planner.LevelLeaf, planner.LevelLeaves:
		return len(d.Names), true
	case planner.LevelSpine:
		return len(g.c.Planner.Leaves(d.Names[0])), true
	}
	return 0, false
}

func (g *gputopoPlacer) release(key string) {
	if _, ok := g.cpuOnly.ledger.held[key]; ok {
		g.cpuOnly.release(key)
	} else {
		for _, h := range g.pods[key] {
			g.cpuOnly.takeScored(h, Job{CPUMilli: h.cpu, MemoryMiB: h.mem}, -1)
		}
		delete(g.pods, key)
	}
	if g.res.Remove(key) {
		return
	}
	if _, ok := g.committed[key]; ok {
		delete(g.committed, key)
		g.stale = true
	}
}

func (g *gputopoPlacer) usage() planner.Usage {
	g.commit(false)
	return planner.Measure(g.snap, g.res)
}
