package simulate

import (
	"context"
	"errors"
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// placer is one scheduler under test. It places every pod of a job or
// none and keeps what it placed until release.
type placer interface {
	place(ctx context.Context, key string, j Job) (placement, error)
	release(key string)
	usage() planner.Usage
}

type placement struct {
	ok    bool
	nodes []int // by pod
	// inDomain: the job lies within the domain its size rule asks for.
	inDomain bool
	// partial: some pods fit but not all (the baseline rolls them back;
	// the plain scheduler would hold their GPUs while the rest wait).
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

func podClaims(cl *claims, key string, j Job) []planner.Pod {
	pods := make([]planner.Pod, j.Pods)
	for i := range pods {
		name := fmt.Sprintf("%s-%d", key, i)
		pods[i] = planner.Pod{Name: name, Claims: []*resourceapi.ResourceClaim{cl.claim(name+"-gpu", j.GPUsPerPod)}}
	}
	return pods
}

// gputopoPlacer plans every job with the planner, exactly as the
// controller does, and holds the plan's devices as a reservation.
//
// Snapshots are immutable and every plan walks all reservations, so
// placed jobs are folded into a fresh snapshot every commitEvery jobs
// (and after a departure from it): the devices in use stay exactly the
// same, only fewer of them are reservations.
type gputopoPlacer struct {
	c        *Cluster
	claims   *claims
	p        *planner.Planner
	strategy planner.Strategy
	snap     *planner.Snapshot
	res      *planner.Reservations // jobs placed since the last commit
	// committed are the devices of the jobs in snap, by job.
	committed map[string][]structured.DeviceID
	stale     bool // a committed job left: snap must be rebuilt
}

const commitEvery = 64

func newGputopo(c *Cluster, cl *claims, strategy planner.Strategy) *gputopoPlacer {
	return &gputopoPlacer{
		c: c, claims: cl, p: planner.New(cl.evaluator()), strategy: strategy,
		snap: planner.NewSnapshot(c.Planner, nil), res: planner.NewReservations(), committed: map[string][]structured.DeviceID{},
	}
}

func (g *gputopoPlacer) place(ctx context.Context, key string, j Job) (placement, error) {
	g.commit(false)
	job := planner.Job{Key: key, Pods: podClaims(g.claims, key, j), Strategy: g.strategy}
	plan, err := g.p.Plan(ctx, g.snap, g.res, job)
	var refused *planner.Unschedulable
	if errors.As(err, &refused) {
		return placement{}, nil
	}
	if err != nil {
		return placement{}, fmt.Errorf("plan job %s: %w", key, err)
	}
	if err := g.res.Add(plan.Reservation()); err != nil {
		return placement{}, fmt.Errorf("hold the devices of job %s: %w", key, err)
	}
	out := placement{ok: true, runs: plan.AllocatorRuns, nodes: make([]int, len(job.Pods))}
	for i, pod := range job.Pods {
		n, ok := g.c.Node(plan.Assignments[pod.Name])
		if !ok {
			return placement{}, fmt.Errorf("plan of job %s puts pod %s on unknown node %q", key, pod.Name, plan.Assignments[pod.Name])
		}
		out.nodes[i] = n
	}
	if span, ok := g.domainLeaves(plan.Domain); ok {
		out.inDomain = span <= g.c.requiredLeaves(j.Pods)
	}
	return out, nil
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
		for _, ids := range r.Devices {
			g.committed[job] = append(g.committed[job], ids...)
		}
		g.res.Remove(job)
	}
	used := devicefit.Allocated{}
	for _, ids := range g.committed {
		used.Insert(ids...)
	}
	g.snap, g.stale = planner.NewSnapshot(g.c.Planner, used), false
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

// baselinePlacer is the plain scheduler without gputopo, topology-
// oblivious: each pod on its own goes to the first node, in name order,
// where the same allocator accepts its claim. A job whose pods do not all
// fit is rolled back, so both schedulers are compared all or nothing.
type baselinePlacer struct {
	c      *Cluster
	claims *claims
	eval   *devicefit.Evaluator
	order  []int                 // node indexes in natural name order
	used   []devicefit.Allocated // by node
	free   []int                 // free GPUs by node
	held   map[string][]hold
	// res mirrors what is held so planner.Measure reads both schedulers
	// the same way.
	snap *planner.Snapshot
	res  *planner.Reservations
}

type hold struct {
	node int
	ids  []structured.DeviceID
}

func newBaseline(c *Cluster, cl *claims) *baselinePlacer {
	b := &baselinePlacer{
		c: c, claims: cl, eval: cl.evaluator(), used: make([]devicefit.Allocated, len(c.Nodes)), free: make([]int, len(c.Nodes)),
		held: map[string][]hold{}, snap: planner.NewSnapshot(c.Planner, nil), res: planner.NewReservations(),
	}
	for i, n := range c.Nodes {
		b.order = append(b.order, i)
		b.used[i] = devicefit.Allocated{}
		b.free[i] = n.GPUs
	}
	sort.SliceStable(b.order, func(x, y int) bool { return topology.NaturalLess(c.Nodes[b.order[x]].Name, c.Nodes[b.order[y]].Name) })
	return b
}

func (b *baselinePlacer) place(ctx context.Context, key string, j Job) (placement, error) {
	out := placement{nodes: make([]int, 0, j.Pods)}
	var holds []hold
	for _, pod := range podClaims(b.claims, key, j) {
		placed := false
		for _, n := range b.order {
			if b.free[n] < j.GPUsPerPod {
				continue
			}
			nd := &b.c.Nodes[n]
			out.runs++
			results, err := b.eval.Allocate(ctx, nd.Obj, nd.Slices, b.used[n], pod.Claims)
			if err != nil {
				return placement{}, fmt.Errorf("baseline: allocate pod %s on node %s: %w", pod.Name, nd.Name, err)
			}
			if results == nil {
				continue
			}
			h := hold{node: n}
			for _, r := range results {
				for _, d := range r.Devices.Results {
					h.ids = append(h.ids, structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
				}
			}
			b.take(h)
			holds = append(holds, h)
			out.nodes = append(out.nodes, n)
			placed = true
			break
		}
		if !placed {
			for _, h := range holds {
				b.give(h)
			}
			return placement{partial: len(holds) > 0, runs: out.runs}, nil
		}
	}
	r := planner.Reservation{Job: key, Pods: map[string]string{}, Devices: map[string][]structured.DeviceID{}}
	for i, h := range holds {
		name := b.c.Nodes[h.node].Name
		r.Pods[fmt.Sprintf("%s-%d", key, i)] = name
		r.Devices[name] = append(r.Devices[name], h.ids...)
	}
	if err := b.res.Add(r); err != nil {
		return placement{}, fmt.Errorf("baseline: record job %s: %w", key, err)
	}
	b.held[key] = holds
	out.ok = true
	span, ok := b.c.leafSpan(out.nodes)
	out.inDomain = ok && span <= b.c.requiredLeaves(j.Pods)
	return out, nil
}

func (b *baselinePlacer) take(h hold) {
	for _, id := range h.ids {
		b.used[h.node].Insert(id)
	}
	b.free[h.node] -= len(h.ids)
}

func (b *baselinePlacer) give(h hold) {
	for _, id := range h.ids {
		b.used[h.node].Delete(id)
	}
	b.free[h.node] += len(h.ids)
}

func (b *baselinePlacer) release(key string) {
	for _, h := range b.held[key] {
		b.give(h)
	}
	delete(b.held, key)
	b.res.Remove(key)
}

func (b *baselinePlacer) usage() planner.Usage { return planner.Measure(b.snap, b.res) }
