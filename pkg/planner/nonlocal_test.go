package planner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Devices of another driver that are local to no one node: a NIC pool
// every node can use (allNodes), one for the nodes of a leaf
// (nodeSelector), one whose devices each say where they are
// (perDeviceNodeSelection). Pods ask for one GPU and one NIC.

const nicDriver = "nic.example.com"

// nicSlice is a pool of count NICs named nic-0, nic-1, ..., local to no
// node until where sets how they are selected.
func nicSlice(pool string, count int, where func(*resourceapi.ResourceSliceSpec)) *resourceapi.ResourceSlice {
	spec := resourceapi.ResourceSliceSpec{Driver: nicDriver, Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1}}
	for i := range count {
		spec.Devices = append(spec.Devices, resourceapi.Device{Name: fmt.Sprintf("nic-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"pool": {StringValue: ptr.To(pool)}, "name": {StringValue: ptr.To(fmt.Sprintf("nic-%d", i))}}})
	}
	where(&spec)
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: nicDriver + "-" + pool}, Spec: spec}
}

func allNodes(s *resourceapi.ResourceSliceSpec) { s.AllNodes = ptr.To(true) }

// onLeaf selects the nodes labelled with leaf.
func onLeaf(leaf string) func(*resourceapi.ResourceSliceSpec) {
	return func(s *resourceapi.ResourceSliceSpec) { s.NodeSelector = leafSelector(leaf) }
}

func leafSelector(leaf string) *v1.NodeSelector {
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
		Key: topology.LabelTopographLeaf, Operator: v1.NodeSelectorOpIn, Values: []string{leaf}}}}}}
}

func nicEvaluator(t testing.TB) *devicefit.Evaluator {
	nic := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nicDriver}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", nicDriver)}}}}}
	return devicefit.NewEvaluator(devicefit.NewClasses(loadSpec[resourceapi.DeviceClass](t, "deviceclass.yaml"), nic))
}

// Nics adds to the latest pods' claim a request for one NIC, of the
// pool named, or of any pool when pool is empty.
func (b *jobBuilder) Nics(pool string) *jobBuilder {
	return b.each(func(p *planner.Pod) {
		req := resourceapi.ExactDeviceRequest{DeviceClassName: nicDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
		if pool != "" {
			req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.attributes[%q].pool == %q", nicDriver, pool)}}}
		}
		spec := &p.Claims[0].Spec.Devices
		spec.Requests = append(spec.Requests, resourceapi.DeviceRequest{Name: "nic", Exactly: &req})
	})
}

// nicCluster is two leaves of two dgx-h100 nodes, labelled with their
// leaves:
//
//	leaf-0: l0n0 l0n1    leaf-1: l1n0 l1n1
func nicCluster(t testing.TB, shared ...*resourceapi.ResourceSlice) *planner.Cluster {
	t.Helper()
	b := makeCluster().Leaf("spine-0", 0, "dgx-h100", 2).Leaf("spine-0", 1, "dgx-h100", 2).
		Label(topology.LabelTopographLeaf, "leaf-0", "l0n0", "l0n1").Label(topology.LabelTopographLeaf, "leaf-1", "l1n0", "l1n1")
	c, err := planner.NewCluster(b.Infos(t), nil, shared...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nicsOf lists the NICs a plan gives each pod, "pool/device", by pod.
func nicsOf(p *planner.Plan) map[string][]string {
	out := map[string][]string{}
	for pod, results := range p.Allocations {
		for _, r := range results {
			for _, d := range r.Devices.Results {
				if d.Driver == nicDriver {
					out[pod] = append(out[pod], d.Pool+"/"+d.Device)
				}
			}
		}
	}
	return out
}

func nicID(pool string, i int) structured.DeviceID {
	return devicefit.DeviceID(nicDriver, pool, fmt.Sprintf("nic-%d", i))
}

// Each pod gets its own NIC from the allNodes pool, whichever node it is
// on; a pod that needs one more NIC than the pool has is refused, and the
// refusal counts the GPUs as GPUs and the NICs as what they are.
func TestNonLocalAllNodes(t *testing.T) {
	c := nicCluster(t, nicSlice("all", 2, allNodes))
	p := planner.New(nicEvaluator(t))
	job := makeJob(t, "j").Pods(2, "gpu-8-node").Nics("").Obj()
	plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string][]string{"p0": {"all/nic-0"}, "p1": {"all/nic-1"}}, nicsOf(plan)); diff != "" {
		t.Errorf("NICs (-want +got):\n%s", diff)
	}
	if plan.Assignments["p0"] == plan.Assignments["p1"] {
		t.Errorf("two pods of 8 GPUs on one node: %v", plan.Assignments)
	}

	job = makeJob(t, "j").Pods(3, "gpu-8-node").Nics("").Obj()
	_, err = p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
	var u *planner.Unschedulable
	if !errors.As(err, &u) {
		t.Fatalf("3 pods for 2 NICs: want Unschedulable, got %v", err)
	}
	if want := "no run of 2 adjacent leaves can hold 3 pods (8 GPUs and 1 nic.example.com device each)"; u.Reason != want {
		t.Errorf("reason: %q, want %q", u.Reason, want)
	}
}

// The NICs of a pool with a nodeSelector on leaf-1 are only for its
// nodes: the pod goes there, though leaf-0 is as free.
func TestNonLocalNodeSelector(t *testing.T) {
	c := nicCluster(t, nicSlice("leaf-1", 1, onLeaf("leaf-1")))
	p := planner.New(nicEvaluator(t))
	for _, pods := range []int{1, 2} {
		job := makeJob(t, "j").Pods(pods, "gpu-1").Nics("").Obj()
		plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
		if pods == 2 {
			// One NIC for two pods.
			var u *planner.Unschedulable
			if !errors.As(err, &u) {
				t.Fatalf("2 pods for 1 NIC: want Unschedulable, got %v, %v", plan, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if node := plan.Assignments["p0"]; node != "l1n0" && node != "l1n1" {
			t.Errorf("pod on %s, want a node of leaf-1", node)
		}
		if diff := cmp.Diff(map[string][]string{"p0": {"leaf-1/nic-0"}}, nicsOf(plan)); diff != "" {
			t.Errorf("NICs (-want +got):\n%s", diff)
		}
		// The allocator's node selector is the slice's, with the node
		// of the pod's GPU.
		if ns := plan.Allocations["p0"][0].NodeSelector; ns == nil || len(ns.NodeSelectorTerms) != 1 {
			t.Errorf("node selector %v, want one term naming the pod's node", ns)
		}
	}
}

// With perDeviceNodeSelection each NIC says where it is: nic-0 on l0n1
// only, nic-1 on leaf-1's nodes, nic-2 everywhere. A pod asking for a
// NIC goes where the one it may have is.
func TestNonLocalPerDeviceNodeSelection(t *testing.T) {
	slice := nicSlice("per-device", 3, func(s *resourceapi.ResourceSliceSpec) {
		s.PerDeviceNodeSelection = ptr.To(true)
		s.Devices[0].NodeName = ptr.To("l0n1")
		s.Devices[1].NodeSelector = leafSelector("leaf-1")
		s.Devices[2].AllNodes = ptr.To(true)
	})
	c := nicCluster(t, slice)
	p := planner.New(nicEvaluator(t))
	for name, tc := range map[string]struct {
		device string
		nodes  []string
	}{
		"nic-0 by node name":     {"nic-0", []string{"l0n1"}},
		"nic-1 by node selector": {"nic-1", []string{"l1n0", "l1n1"}},
		"nic-2 on all nodes":     {"nic-2", []string{"l0n0", "l0n1", "l1n0", "l1n1"}},
	} {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(1, "gpu-1").Nics("").Obj()
			req := job.Pods[0].Claims[0].Spec.Devices.Requests[1].Exactly
			req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.attributes[%q].name == %q", nicDriver, tc.device)}}}
			// Fill the nodes it may use but the last, so the plan cannot
			// go there by chance.
			used := allocated().Nodes(tc.nodes[:len(tc.nodes)-1]...).Obj()
			plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, used), nil, job)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := plan.Assignments["p0"], tc.nodes[len(tc.nodes)-1]; got != want {
				t.Errorf("pod on %s, want %s", got, want)
			}
			if diff := cmp.Diff(map[string][]string{"p0": {"per-device/" + tc.device}}, nicsOf(plan)); diff != "" {
				t.Errorf("NICs (-want +got):\n%s", diff)
			}
		})
	}
	// nic-0 is l0n1's alone: with l0n1 full, no node can give it.
	job := makeJob(t, "j").Pods(1, "gpu-1").Nics("").Obj()
	job.Pods[0].Claims[0].Spec.Devices.Requests[1].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.attributes[%q].name == %q", nicDriver, "nic-0")}}}
	var u *planner.Unschedulable
	if _, err := p.Plan(context.Background(), planner.NewSnapshot(c, allocated().Nodes("l0n1").Obj()), nil, job); !errors.As(err, &u) {
		t.Errorf("nic-0 with l0n1 full: want Unschedulable, got %v", err)
	}
}

// One NIC every node can use: the first pod of a plan takes it, so the
// second, on another node alike to the first's, cannot have it too; two one-pod jobs planned
// one after the other, the first reserved, cannot both have it either.
func TestNonLocalDeviceTakenByAnEarlierPod(t *testing.T) {
	c := nicCluster(t, nicSlice("all", 1, allNodes))
	p := planner.New(nicEvaluator(t))
	for _, placement := range []planner.Placement{planner.PlacementAuto, planner.PlacementNone} {
		job := makeJob(t, "j").Pods(2, "gpu-8-node").Nics("").Placement(placement).Obj()
		plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
		var u *planner.Unschedulable
		if !errors.As(err, &u) {
			t.Errorf("placement %s: two pods for one NIC: want Unschedulable, got %v", placement, nicsOf(plan))
			continue
		}
		// The nodes are alike, yet the second pod's answer is not the
		// first's: the first took the NIC.
		if u.BestPods != 1 {
			t.Errorf("placement %s: the closest domain holds %d pods, want 1: %v", placement, u.BestPods, u)
		}
	}
	// Two whole-node pods that both want nic-0, and a one-GPU pod that
	// wants nic-1, on one leaf of three nodes: counting free NICs cannot
	// tell that the second whole-node pod has none left, only the
	// allocator can; the leaf holds the first and the one-GPU pod.
	c2, err := planner.NewCluster(makeCluster().Leaf("spine-0", 0, "dgx-h100", 3).Infos(t), nil, nicSlice("all", 2, allNodes))
	if err != nil {
		t.Fatal(err)
	}
	job := makeJob(t, "j").Pods(2, "gpu-8-node").Nics("").Pods(1, "gpu-1").Nics("").Obj()
	for i, want := range []string{"nic-0", "nic-0", "nic-1"} {
		job.Pods[i].Claims[0].Spec.Devices.Requests[1].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.attributes[%q].name == %q", nicDriver, want)}}}
	}
	plan, err := p.Plan(context.Background(), planner.NewSnapshot(c2, nil), nil, job)
	var u *planner.Unschedulable
	switch {
	case !errors.As(err, &u):
		t.Errorf("two pods for nic-0: want Unschedulable, got %v", nicsOf(plan))
	case u.BestPods != 2:
		t.Errorf("two pods for nic-0: the closest domain holds %d pods, want 2: %v", u.BestPods, u)
	}

	res := planner.NewReservations()
	first, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), res, makeJob(t, "a").Pods(1, "gpu-1").Nics("").Obj())
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Add(first.Reservation()); err != nil {
		t.Fatal(err)
	}
	second, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), res, makeJob(t, "b").Pods(1, "gpu-1").Nics("").Obj())
	if !errors.As(err, &u) {
		t.Errorf("second job while the first holds the NIC: want Unschedulable, got %v on %v", nicsOf(second), second.Assignments)
	}
}

// A NIC an allocated claim holds is taken on every node; the snapshot
// knows it whether it was taken whole, from a tracker, or after the
// non-local slices changed.
func TestNonLocalDeviceAllocatedInSnapshot(t *testing.T) {
	shared := nicSlice("all", 2, allNodes)
	c := nicCluster(t, shared)
	p := planner.New(nicEvaluator(t))
	held := devicefit.Allocated{}
	held.Insert(nicID("all", 0))
	tr := planner.NewTracker(c, devicefit.Allocated{}, nil)
	tr.SetDevice(nicID("all", 0), true)
	grown := shared.DeepCopy()
	grown.Spec.Devices = append(grown.Spec.Devices, resourceapi.Device{Name: "nic-2"})
	// nic-2 is new, so only nic-1 and nic-2 are free.
	c2, err := c.WithShared([]*resourceapi.ResourceSlice{grown})
	if err != nil {
		t.Fatal(err)
	}
	tr2 := planner.NewTracker(c, held, nil)
	tr2.Rebase(c2, nil, held, nil)
	for name, tc := range map[string]struct {
		snap *planner.Snapshot
		nics int // free NICs
	}{
		"NewSnapshot":             {planner.NewSnapshot(c, held), 1},
		"NewSnapshotFromState":    {planner.NewSnapshotFromState(c, devicefit.State{Devices: held}), 1},
		"Tracker.SetDevice":       {tr.Snapshot(devicefit.NewState()), 1},
		"Tracker.Rebase, grown":   {tr2.Snapshot(devicefit.NewState()), 2},
		"nothing held, for scale": {planner.NewSnapshot(c, nil), 2},
	} {
		t.Run(name, func(t *testing.T) {
			for pods := 1; pods <= 3; pods++ {
				job := makeJob(t, "j").Pods(pods, "gpu-8-node").Nics("").Obj()
				plan, err := p.Plan(context.Background(), tc.snap, nil, job)
				var u *planner.Unschedulable
				switch {
				case pods <= tc.nics && err != nil:
					t.Errorf("%d pods, %d free NICs: %v", pods, tc.nics, err)
				case pods <= tc.nics:
					for pod, nics := range nicsOf(plan) {
						if slices.Contains(nics, "all/nic-0") && name != "nothing held, for scale" {
							t.Errorf("pod %s got nic-0, which a claim holds", pod)
						}
					}
				case !errors.As(err, &u):
					t.Errorf("%d pods, %d free NICs: want Unschedulable, got %v", pods, tc.nics, nicsOf(plan))
				}
			}
		})
	}
}

// The planner's answer for a pod is the structured allocator's, run
// directly with every slice of the cluster, as kube-scheduler runs it:
// the pod is placed if and only if some node can hold it, and the
// allocation on its node is the allocator's own.
func TestNonLocalAgreesWithAllocator(t *testing.T) {
	perDevice := nicSlice("per-device", 2, func(s *resourceapi.ResourceSliceSpec) {
		s.PerDeviceNodeSelection = ptr.To(true)
		s.Devices[0].NodeName = ptr.To("l1n1")
		s.Devices[1].NodeSelector = leafSelector("leaf-0")
	})
	shared := []*resourceapi.ResourceSlice{nicSlice("all", 1, allNodes), nicSlice("leaf-1", 2, onLeaf("leaf-1")), perDevice}
	c := nicCluster(t, shared...)
	b := makeCluster().Leaf("spine-0", 0, "dgx-h100", 2).Leaf("spine-0", 1, "dgx-h100", 2).
		Label(topology.LabelTopographLeaf, "leaf-0", "l0n0", "l0n1").Label(topology.LabelTopographLeaf, "leaf-1", "l1n0", "l1n1")
	infos := b.Infos(t)
	all := slices.Clone(shared)
	for _, in := range infos {
		all = append(all, in.Slices...)
	}
	eval := nicEvaluator(t)
	p := planner.New(eval)
	held := func(ids ...structured.DeviceID) devicefit.Allocated {
		out := devicefit.Allocated{}
		for _, id := range ids {
			out.Insert(id)
		}
		return out
	}
	for name, tc := range map[string]struct {
		pool string // the NIC pool the pod asks for; empty: any
		gpus string // the GPU template
		used devicefit.Allocated
	}{
		"any NIC, nothing held":            {"", "gpu-1", held()},
		"allNodes NIC held":                {"all", "gpu-1", held(nicID("all", 0))},
		"allNodes NIC free":                {"all", "gpu-8-node", held(nicID("leaf-1", 0))},
		"leaf-1 NICs, one held":            {"leaf-1", "gpu-1", held(nicID("leaf-1", 1))},
		"leaf-1 NICs, both held":           {"leaf-1", "gpu-1", held(nicID("leaf-1", 0), nicID("leaf-1", 1))},
		"leaf-1 NICs, leaf-1 GPUs held":    {"leaf-1", "gpu-1", with(allocated().Nodes("l1n0", "l1n1").Obj())},
		"leaf-1 NIC, one leaf-1 node full": {"leaf-1", "gpu-8-node", with(allocated().Nodes("l1n0").Obj(), nicID("leaf-1", 0))},
		"per-device NICs, l1n1 full":       {"per-device", "gpu-8-node", with(allocated().Nodes("l1n1").Obj())},
		"per-device NICs, leaf-0 full":     {"per-device", "gpu-8-node", with(allocated().Nodes("l0n0", "l0n1").Obj(), nicID("per-device", 0))},
		"per-device NICs, all held":        {"per-device", "gpu-1", held(nicID("per-device", 0), nicID("per-device", 1))},
	} {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(1, tc.gpus).Nics(tc.pool).Obj()
			claims := job.Pods[0].Claims
			alloc, err := structured.NewAllocator(context.Background(), devicefit.Features(), structured.AllocatedState{AllocatedDevices: tc.used}, eval.Classes, all, eval.Cache)
			if err != nil {
				t.Fatal(err)
			}
			direct := map[string][]resourceapi.AllocationResult{}
			for _, in := range infos {
				node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: in.Name, Labels: in.Labels}}
				res, err := alloc.Allocate(context.Background(), node, claims)
				if err != nil {
					t.Fatal(err)
				}
				if res != nil {
					direct[in.Name] = res
				}
			}
			plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, tc.used), nil, job)
			var u *planner.Unschedulable
			switch {
			case len(direct) == 0 && errors.As(err, &u):
			case len(direct) == 0:
				t.Fatalf("the allocator fits no node; the planner: %v, %v", err, plan)
			case err != nil:
				t.Fatalf("the allocator fits %d nodes; the planner: %v", len(direct), err)
			default:
				node := plan.Assignments["p0"]
				if diff := cmp.Diff(direct[node], plan.Allocations["p0"]); diff != "" {
					t.Errorf("allocation on %s (-allocator +planner):\n%s", node, diff)
				}
			}
		})
	}
}

// with adds devices to a set.
func with(set devicefit.Allocated, ids ...structured.DeviceID) devicefit.Allocated {
	for _, id := range ids {
		set.Insert(id)
	}
	return set
}

// A slice local to a node is that node's: listing it as non-local is an
// error, and so is a device a node and a non-local slice both publish.
func TestNonLocalSlicesMustBeNonLocal(t *testing.T) {
	local := nicSlice("l0n0", 1, func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To("l0n0") })
	if _, err := planner.NewCluster(nil, nil, local); err == nil {
		t.Error("NewCluster took a node-local slice as non-local")
	}
	clash := nicSlice("l0n0", 1, allNodes)
	clash.Spec.Driver, clash.Spec.Devices[0].Name = topology.DriverName, "gpu-0"
	if _, err := planner.NewCluster(makeCluster().Leaf("spine-0", 0, "dgx-h100", 1).Infos(t), nil, clash); err == nil {
		t.Error("NewCluster took a device published by a node and by a non-local slice")
	}
	if name, ok := planner.NodeLocal(local); !ok || name != "l0n0" {
		t.Errorf("NodeLocal(node slice) = %q, %v", name, ok)
	}
	if _, ok := planner.NodeLocal(clash); ok {
		t.Error("NodeLocal(allNodes slice) is local")
	}
}

// Non-local devices a job cannot select leave its plan as cheap as
// without them: a GPU-only job asks the allocator as often on a cluster
// with a NIC pool every node can use as on one without, and is placed
// alike.
func TestNonLocalDevicesTheJobCannotSelectCostNothing(t *testing.T) {
	b := makeCluster().Spines(1, 4, 4, "dgx-h100")
	used := allocated().GPUs("l0n0", 0, 1).GPUs("l1n2", 4).Nodes("l2n1").Obj()
	p := planner.New(nicEvaluator(t))
	for name, job := range map[string]planner.Job{
		"pairs":       makeJob(t, "j").Pods(6, "gpu-2-nvlink-pair").Obj(),
		"whole nodes": makeJob(t, "j").Pods(5, "gpu-8-node").Obj(),
		"one GPU":     makeJob(t, "j").Pods(1, "gpu-1").Obj(),
	} {
		t.Run(name, func(t *testing.T) {
			var runs []int
			var plans []*placed
			for _, shared := range [][]*resourceapi.ResourceSlice{nil, {nicSlice("all", 8, allNodes)}} {
				c, err := planner.NewCluster(b.Infos(t), nil, shared...)
				if err != nil {
					t.Fatal(err)
				}
				plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, used), nil, job)
				if err != nil {
					t.Fatal(err)
				}
				runs, plans = append(runs, plan.AllocatorRuns), append(plans, project(plan))
			}
			if runs[0] != runs[1] {
				t.Errorf("allocator runs: %d without the NICs, %d with them", runs[0], runs[1])
			}
			if diff := cmp.Diff(plans[0], plans[1]); diff != "" {
				t.Errorf("plans differ (-without +with the NICs):\n%s", diff)
			}
		})
	}
}

// A NIC that allows multiple allocations serves several pods of one plan
// as far as its capacity goes, as the allocator counts it: 10 units of
// bandwidth hold two pods asking for 4 each, not three.
func TestNonLocalDeviceWithMultipleAllocations(t *testing.T) {
	slice := nicSlice("all", 1, allNodes)
	slice.Spec.Devices[0].AllowMultipleAllocations = ptr.To(true)
	slice.Spec.Devices[0].Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"bandwidth": {Value: resource.MustParse("10")}}
	c := nicCluster(t, slice)
	p := planner.New(nicEvaluator(t))
	for pods, fits := range map[int]bool{2: true, 3: false} {
		job := makeJob(t, "j").Pods(pods, "gpu-1").Nics("").Obj()
		for _, pod := range job.Pods {
			pod.Claims[0].Spec.Devices.Requests[1].Exactly.Capacity = &resourceapi.CapacityRequirements{
				Requests: map[resourceapi.QualifiedName]resource.Quantity{"bandwidth": resource.MustParse("4")}}
		}
		plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
		var u *planner.Unschedulable
		switch {
		case fits && err != nil:
			t.Errorf("%d pods: %v", pods, err)
		case fits:
			want := map[string][]string{}
			for i := range pods {
				want[fmt.Sprintf("p%d", i)] = []string{"all/nic-0"}
			}
			if diff := cmp.Diff(want, nicsOf(plan)); diff != "" {
				t.Errorf("%d pods: NICs (-want +got):\n%s", pods, diff)
			}
		case !errors.As(err, &u):
			t.Errorf("%d pods of 4 on a NIC of 10: want Unschedulable, got %v", pods, nicsOf(plan))
		case u.BestPods != 2:
			t.Errorf("%d pods of 4 on a NIC of 10: the closest domain holds %d, want 2: %v", pods, u.BestPods, u)
		}
	}
}
