package planner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// twoLeaves is the topology of the node filter cases:
//
//	              spine-0
//	        +--------+--------+
//	     leaf-0            leaf-1
//	l0n0,l0n1,l0n2    l1n0,l1n1,l1n2
//
// Every node is a dgx-h100. Without filters a 2- or 3-pod job of whole
// nodes goes to leaf-0, the first of two equal leaves.
func twoLeaves() *clusterBuilder { return makeCluster().Spines(1, 2, 3, "dgx-h100") }

const maint = "gpu=maint:NoSchedule"

// node8 is what every node offers to pods in the resource cases.
var node8 = resources("cpu", "8", "memory", "64Gi", "pods", "10")

// onNodes counts pods with the given requests against nodes.
func onNodes(requests v1.ResourceList, nodes ...string) planner.NodeUsage {
	u := planner.NodeUsage{}
	for _, n := range nodes {
		u.Add(n, podRequesting(n+"-other", requests))
	}
	return u
}

func podRequesting(name string, requests v1.ResourceList) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: requests}}}}}
}

func nodeNamed(name string) v1.NodeSelectorTerm {
	return v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{name}}}}
}

func TestNodeFilters(t *testing.T) {
	spine := planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}}
	allOfLeaf1 := &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1", "l1n2")}
	tests := map[string]struct {
		cluster *clusterBuilder
		used    planner.NodeUsage
		job     func(t testing.TB) planner.Job
		want    *placed
		wantErr *planner.Unschedulable
	}{
		"NotReady node is skipped inside the leaf": {
			cluster: twoLeaves().NotReady("l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(2, "gpu-8-node").Obj() },
			want:    &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n2")},
		},
		"NotReady node leaves its leaf too small": {
			cluster: twoLeaves().NotReady("l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Obj() },
			want:    allOfLeaf1,
		},
		"NoSchedule taint without toleration": {
			cluster: twoLeaves().Taint(maint, "l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Obj() },
			want:    allOfLeaf1,
		},
		"NoSchedule taint with toleration": {
			cluster: twoLeaves().Taint(maint, "l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Tolerate(maint).Obj() },
			want:    &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1", "l0n2")},
		},
		"NoExecute taint without toleration": {
			cluster: twoLeaves().Taint("gpu=maint:NoExecute", "l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Tolerate(maint).Obj() },
			want:    allOfLeaf1,
		},
		"PreferNoSchedule taint keeps no pod away": {
			cluster: twoLeaves().Taint("gpu=maint:PreferNoSchedule", "l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Obj() },
			want:    &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1", "l0n2")},
		},
		"cordoned node": {
			cluster: twoLeaves().Cordon("l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Obj() },
			want:    allOfLeaf1,
		},
		"cordoned node tolerated like the scheduler does": {
			cluster: twoLeaves().Cordon("l0n0"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(3, "gpu-8-node").Tolerate(v1.TaintNodeUnschedulable + ":NoSchedule").Obj()
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1", "l0n2")},
		},
		"nodeSelector": {
			cluster: twoLeaves().Label("pool", "a", "l1n1", "l1n2"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Selector("pool", "a").Obj()
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n1", "l1n2")},
		},
		"required affinity on labels": {
			cluster: twoLeaves().Label("pool", "b", "l0n0", "l0n1"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Requires(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{
					{Key: "pool", Operator: v1.NodeSelectorOpNotIn, Values: []string{"b"}}}}).Obj()
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1")},
		},
		// One allowed node per leaf: no leaf holds the job, the spine does.
		"required affinity on node names": {
			cluster: twoLeaves(),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Requires(nodeNamed("l0n1"), nodeNamed("l1n2")).Obj()
			},
			want: &placed{Domain: spine, Assignments: assign("l0n1", "l1n2")},
		},
		"cpu taken by other pods": {
			cluster: twoLeaves().Allocatable(node8),
			used:    onNodes(resources("cpu", "6"), "l0n2"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(3, "gpu-8-node").Request(resources("cpu", "4")).Obj()
			},
			want: allOfLeaf1,
		},
		"memory taken by other pods": {
			cluster: twoLeaves().Allocatable(node8),
			used:    onNodes(resources("memory", "40Gi"), "l0n1"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(3, "gpu-8-node").Request(resources("memory", "32Gi")).Obj()
			},
			want: allOfLeaf1,
		},
		// Consolidated would put all four 1-GPU pods on l0n0; its cpu
		// holds two.
		"cpu taken by the plan's own pods": {
			cluster: twoLeaves().Allocatable(node8),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(4, "gpu-1").Request(resources("cpu", "4")).Strategy(planner.StrategyConsolidated).Obj()
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0", "l0n1", "l0n1")},
		},
		"pod slots taken by other pods": {
			cluster: twoLeaves().Allocatable(resources("pods", "2")),
			used:    onNodes(nil, "l0n0", "l0n0"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Obj() },
			want:    allOfLeaf1,
		},
		// One pod slot per node: four pods need four nodes, more than a leaf.
		"pod slots taken by the plan's own pods": {
			cluster: twoLeaves().Allocatable(resources("pods", "1")),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(4, "gpu-1").Strategy(planner.StrategyConsolidated).Obj()
			},
			want: &placed{Domain: spine, Assignments: assign("l0n0", "l0n1", "l0n2", "l1n0")},
		},
		// p1 can only use l0n0; p0 could use it too, so p1 goes first.
		"pods of one job with different tolerations": {
			cluster: twoLeaves().Taint(maint, "l0n1", "l0n2", "l1n0", "l1n1", "l1n2"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-8-node").Tolerate(maint).Pods(1, "gpu-8-node").Obj()
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: map[string]string{"p0": "l0n1", "p1": "l0n0"}},
		},
		// p1 goes first, as fewer nodes accept it, but not onto l0n0.
		"only the tolerating pod of a job goes to the tainted node": {
			cluster: twoLeaves().Taint(maint, "l0n0"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-8-node").Tolerate(maint).Pods(1, "gpu-8-node").Obj()
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: map[string]string{"p0": "l0n0", "p1": "l0n1"}},
		},
		// Equal claims, different volumes: two shapes, each on its node.
		"pods of one job held to different nodes by their volumes": {
			cluster: twoLeaves().Label("disk", "a", "l0n2").Label("disk", "b", "l1n1"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-8-node").Volume("disk", "a").Pods(1, "gpu-8-node").Volume("disk", "b").Obj()
			},
			want: &placed{Domain: spine, Assignments: map[string]string{"p0": "l0n2", "p1": "l1n1"}},
		},
		"a resource no node offers": {
			cluster: twoLeaves().Allocatable(node8),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-1").Request(resources("example.com/fpga", "1")).Obj()
			},
			wantErr: &planner.Unschedulable{Job: "j", Reason: "no node can hold 1 pod (1 GPU each), not even when empty",
				Filtered: []planner.FilteredNodes{{Filter: planner.FilterResources, Detail: "example.com/fpga", Nodes: 6}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			snap := planner.NewSnapshot(tc.cluster.Obj(t), nil, planner.WithUsed(tc.used))
			plan, err := newPlanner(t).Plan(context.Background(), snap, nil, tc.job(t))
			checkPlan(t, plan, err, tc.want, tc.wantErr)
		})
	}
}

// Nodes with the same devices share allocator answers; which of them a
// pod may use must not be shared with them.
func TestFiltersAreNotSharedBetweenEqualNodes(t *testing.T) {
	oneLeaf := func() *clusterBuilder { return makeCluster().Leaf("spine-0", 0, "dgx-h100", 3) }
	tests := map[string]struct {
		cluster  *clusterBuilder
		used     planner.NodeUsage
		pod      func(*jobBuilder) *jobBuilder
		filtered planner.FilteredNodes
		reason   string
	}{
		"taint": {
			cluster:  oneLeaf().Taint(maint, "l0n0"),
			pod:      func(b *jobBuilder) *jobBuilder { return b },
			filtered: planner.FilteredNodes{Filter: planner.FilterTaint, Detail: maint, Nodes: 1},
			reason:   "no leaf can hold 3 pods (8 GPUs each), not even when empty",
		},
		"label": {
			cluster:  oneLeaf().Label("pool", "a", "l0n1", "l0n2"),
			pod:      func(b *jobBuilder) *jobBuilder { return b.Selector("pool", "a") },
			filtered: planner.FilteredNodes{Filter: planner.FilterAffinity, Nodes: 1},
			reason:   "no leaf can hold 3 pods (8 GPUs each), not even when empty",
		},
		"volume": {
			cluster:  oneLeaf().Label("disk", "local", "l0n1", "l0n2"),
			pod:      func(b *jobBuilder) *jobBuilder { return b.Volume("disk", "local") },
			filtered: planner.FilteredNodes{Filter: planner.FilterVolumes, Nodes: 1},
			reason:   "no leaf can hold 3 pods (8 GPUs each), not even when empty",
		},
		// The cpu frees up when the other pod goes.
		"cpu": {
			cluster:  oneLeaf().Allocatable(node8),
			used:     onNodes(resources("cpu", "7"), "l0n0"),
			pod:      func(b *jobBuilder) *jobBuilder { return b.Request(resources("cpu", "2")) },
			filtered: planner.FilteredNodes{Filter: planner.FilterResources, Detail: "cpu", Nodes: 1},
			reason:   "no leaf can hold 3 pods (8 GPUs each)",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			snap := planner.NewSnapshot(tc.cluster.Obj(t), nil, planner.WithUsed(tc.used))
			p := newPlanner(t)
			plan, err := p.Plan(context.Background(), snap, nil, tc.pod(makeJob(t, "j").Pods(2, "gpu-8-node")).Obj())
			checkPlan(t, plan, err, &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n2")}, nil)

			_, err = p.Plan(context.Background(), snap, nil, tc.pod(makeJob(t, "j").Pods(3, "gpu-8-node")).Placement(planner.PlacementSameLeaf).Obj())
			checkPlan(t, nil, err, nil, &planner.Unschedulable{Job: "j",
				Reason: tc.reason, Best: "leaf leaf-0 holds 2 (2 nodes with room for a pod)",
				BestDomain: leaf("leaf-0"), BestPods: 2, Filtered: []planner.FilteredNodes{tc.filtered}})
		})
	}
}

func TestRefusalCountsRuledOutNodes(t *testing.T) {
	c := twoLeaves().NotReady("l0n0").Taint(maint, "l0n1", "l1n0").Allocatable(node8).Obj(t)
	snap := planner.NewSnapshot(c, nil, planner.WithUsed(onNodes(resources("cpu", "8"), "l1n1")))
	job := makeJob(t, "j").Pods(2, "gpu-8-node").Request(resources("cpu", "1")).Placement(planner.PlacementSameLeaf).Obj()
	_, err := newPlanner(t).Plan(context.Background(), snap, nil, job)
	var u *planner.Unschedulable
	if !errors.As(err, &u) {
		t.Fatalf("want Unschedulable, got %v", err)
	}
	want := []planner.FilteredNodes{
		{Filter: planner.FilterNotReady, Nodes: 1},
		{Filter: planner.FilterTaint, Detail: maint, Nodes: 2},
		{Filter: planner.FilterResources, Detail: "cpu", Nodes: 1},
	}
	if diff := cmp.Diff(want, u.Filtered); diff != "" {
		t.Errorf("filtered (-want +got):\n%s", diff)
	}
	const line = "4 nodes ruled out for the job's pods: 1 NotReady, 2 with untolerated taint " + maint + ", 1 without enough cpu"
	if !strings.HasSuffix(err.Error(), "; "+line) {
		t.Errorf("error %q does not end with %q", err, line)
	}

	// The same line explains a plan that found room elsewhere.
	job.Pods = job.Pods[:1]
	plan, err := newPlanner(t).Plan(context.Background(), snap, nil, job)
	if err != nil {
		t.Fatal(err)
	}
	if !hasReason(plan.Reasons, line) {
		t.Errorf("no reason says %q:\n%s", line, strings.Join(plan.Reasons, "\n"))
	}
}

// Another plan's pods hold their cpu until they are bound, as they hold
// their devices.
func TestReservationsHoldRequests(t *testing.T) {
	c := twoLeaves().Allocatable(node8).Obj(t)
	snap := planner.NewSnapshot(c, nil)
	p, res := newPlanner(t), planner.NewReservations()
	a, err := p.Plan(context.Background(), snap, res, makeJob(t, "a").Pods(1, "gpu-1").Request(resources("cpu", "6")).Obj())
	if err != nil {
		t.Fatal(err)
	}
	r := a.Reservation()
	if diff := cmp.Diff(planner.NodeUsage{"l0n0": resources("cpu", "6", "pods", "1")}, r.Requests); diff != "" {
		t.Fatalf("reserved requests (-want +got):\n%s", diff)
	}
	if err := res.Add(r); err != nil {
		t.Fatal(err)
	}
	// Without the reserved cpu, b would join a on l0n0, the fullest node.
	b, err := p.Plan(context.Background(), snap, res, makeJob(t, "b").Pods(1, "gpu-1").Request(resources("cpu", "4")).Obj())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(assign("l0n1"), b.Assignments); diff != "" {
		t.Errorf("b (-want +got):\n%s", diff)
	}
}

func TestInvalidAffinityIsInvalidJob(t *testing.T) {
	job := makeJob(t, "j").Pods(1, "gpu-1").Requires(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{
		{Key: "pool", Operator: v1.NodeSelectorOpIn}}}).Obj()
	_, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(twoLeaves().Obj(t), nil), nil, job)
	var invalid *planner.InvalidJobError
	if !errors.As(err, &invalid) {
		t.Fatalf("want InvalidJobError, got %v", err)
	}
}

func TestNodeInfoFor(t *testing.T) {
	labels := map[string]string{topology.LabelTopographLeaf: "leaf-0"}
	taints := []v1.Taint{parseTaint(maint)}
	tests := map[string]struct {
		node *v1.Node
		want planner.NodeInfo
	}{
		"ready": {
			node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: v1.NodeSpec{Taints: taints},
				Status: v1.NodeStatus{Allocatable: node8, Conditions: []v1.NodeCondition{
					{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse}, {Type: v1.NodeReady, Status: v1.ConditionTrue}}}},
			want: planner.NodeInfo{Name: "n", Leaf: "leaf-0", Labels: labels, Taints: taints, Allocatable: node8},
		},
		"not ready": {
			node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: v1.NodeSpec{Unschedulable: true},
				Status: v1.NodeStatus{Allocatable: node8, Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionUnknown}}}},
			want: planner.NodeInfo{Name: "n", Leaf: "leaf-0", Labels: labels, Unschedulable: true, NotReady: true, Allocatable: node8},
		},
		// A node that never reported holds no pod.
		"no status": {
			node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}},
			want: planner.NodeInfo{Name: "n", Leaf: "leaf-0", Labels: labels, NotReady: true, Allocatable: v1.ResourceList{}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := planner.NodeInfoFor(tc.node, nil, topology.DefaultLabelMapping())
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("NodeInfo (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodForAndNodeUsage(t *testing.T) {
	pod := podRequesting("p", resources("cpu", "2", "memory", "1Gi"))
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "side", Resources: v1.ResourceRequirements{Requests: resources("cpu", "1")}})
	// An init container runs alone: only its larger memory counts.
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Requests: resources("cpu", "1", "memory", "4Gi")}}}
	pod.Spec.Overhead = resources("cpu", "250m")
	pod.Spec.NodeSelector = map[string]string{"pool": "a"}
	pod.Spec.Tolerations = []v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpExists}}
	anti := []v1.PodAffinityTerm{{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}, TopologyKey: v1.LabelHostname}}
	pod.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{}},
		PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: anti}}
	pod.Namespace, pod.Labels = "ns", map[string]string{"app": "a"}
	// Only the spread constraints that must hold are the planner's.
	must := v1.TopologySpreadConstraint{MaxSkew: 1, TopologyKey: v1.LabelHostname, WhenUnsatisfiable: v1.DoNotSchedule}
	pod.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{
		{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.ScheduleAnyway}, must}
	// The host ports of containers and of init containers that run
	// beside them; not of an init container that ends first.
	hostPort := v1.ContainerPort{ContainerPort: 29500, HostPort: 29500}
	pod.Spec.Containers[1].Ports = []v1.ContainerPort{hostPort, {ContainerPort: 8080}}
	pod.Spec.InitContainers[0].Ports = []v1.ContainerPort{{ContainerPort: 9000, HostPort: 9000}}
	claims := []*resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Name: "c"}}}

	want := planner.Pod{HostPorts: []v1.ContainerPort{hostPort}, Name: "p", Claims: claims, NodeSelector: pod.Spec.NodeSelector, NodeAffinity: pod.Spec.Affinity.NodeAffinity,
		OwnNodeAffinity: pod.Spec.Affinity.NodeAffinity,
		Tolerations:     pod.Spec.Tolerations, Requests: resources("cpu", "3250m", "memory", "4Gi"),
		AntiAffinity: anti, Members: []planner.Member{{Namespace: "ns", Labels: pod.Labels}},
		Spread: []v1.TopologySpreadConstraint{must}}
	if diff := cmp.Diff(want, planner.PodFor(pod, claims)); diff != "" {
		t.Errorf("PodFor (-want +got):\n%s", diff)
	}

	u := planner.NodeUsage{}
	u.Add("n", pod)
	u.Add("n", pod)
	done := pod.DeepCopy()
	done.Status.Phase = v1.PodSucceeded
	u.Add("n", done)
	u.Add("", pod)
	if diff := cmp.Diff(planner.NodeUsage{"n": resources("cpu", "6500m", "memory", "8Gi", "pods", "2")}, u, cmpQuantity); diff != "" {
		t.Errorf("usage of two pods (-want +got):\n%s", diff)
	}
	u.Remove("n", done)
	u.Remove("n", pod)
	if diff := cmp.Diff(planner.NodeUsage{"n": resources("cpu", "3250m", "memory", "4Gi", "pods", "1")}, u, cmpQuantity); diff != "" {
		t.Errorf("usage of one pod (-want +got):\n%s", diff)
	}
	u.Remove("n", pod)
	if len(u) != 0 {
		t.Errorf("a node without pods is still counted: %v", u)
	}
}

// cmpQuantity compares amounts, not how they are written.
var cmpQuantity = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

// A plan split into the pods it writes and pods that only stand in for
// others (the controller's followers of an exclusive JobSet) holds the
// second part's devices and requests apart, and the two holds together
// are the whole plan's.
func TestPlanSplit(t *testing.T) {
	c := twoLeaves().Allocatable(node8).Obj(t)
	job := makeJob(t, "a").Pods(2, "gpu-4-nvlink").Request(resources("cpu", "2")).Strategy(planner.StrategyDistributed).Obj()
	plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
	if err != nil {
		t.Fatal(err)
	}
	rest, held := plan.Split(job.Pods[1:])
	if _, ok := rest.Assignments["p1"]; ok || len(rest.Allocations) != 1 || len(rest.Assignments) != 1 {
		t.Fatalf("the rest of the plan still has p1: %v", rest.Assignments)
	}
	if _, ok := plan.Assignments["p1"]; !ok {
		t.Fatal("Split changed the plan it split")
	}
	n1 := plan.Assignments["p1"]
	if diff := cmp.Diff(map[string]string{"p1": n1}, held.Pods); diff != "" {
		t.Errorf("held pods (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(planner.NodeUsage{n1: resources("cpu", "2", "pods", "1")}, held.Requests); diff != "" {
		t.Errorf("held requests (-want +got):\n%s", diff)
	}
	if len(held.Devices[n1]) != 4 || len(held.Devices) != 1 {
		t.Errorf("held devices %v, want p1's four GPUs on %s", held.Devices, n1)
	}
	whole, both := plan.Reservation(), rest.Reservation().With(held)
	for n, l := range whole.Requests {
		for name, q := range l {
			if got := both.Requests[n][name]; got.Cmp(q) != 0 {
				t.Errorf("requests on %s: %s %s together, %s in the whole plan", n, name, got.String(), q.String())
			}
		}
	}
	count := func(r planner.Reservation) (n int) {
		for _, ids := range r.Devices {
			n += len(ids)
		}
		return n
	}
	if count(both) != count(whole) || len(both.Pods) != len(whole.Pods) {
		t.Errorf("the halves hold %d devices and %d pods, the whole plan %d and %d", count(both), len(both.Pods), count(whole), len(whole.Pods))
	}
}

// A pod without node affinity still gets its own, empty, so that a caller
// narrowing NodeAffinity (to an allocated claim's node, off a refused
// node) does not narrow the nodes its spread constraints count.
func TestPodForKeepsThePodsOwnAffinity(t *testing.T) {
	p := planner.PodFor(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}, nil)
	if p.OwnNodeAffinity == nil || p.OwnNodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		t.Fatalf("own node affinity %v, want an empty one", p.OwnNodeAffinity)
	}
	if p.NodeAffinity != nil {
		t.Errorf("node affinity %v, want none", p.NodeAffinity)
	}
}
