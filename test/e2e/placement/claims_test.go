package placement

// End-to-end tests of README claims about placement that the other tests
// of the suite do not prove: one-pod fragmentation-aware placement, the
// three strategies, best fit, explicit same-spine and adjacent-leaves, a
// preferred domain that is not required, gputopo.dev/group without a Job,
// the node affinity that holds a placed group to its domain, and the
// controller's Placed, Reserved, NotBound and DeviceConflict events.
// docs/claims.md maps each claim to its test.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// Waits for events that come after a controller timer: --reserve-after
// (30 s), with the slack a loaded machine needs.
const waitReserve = 30*time.Second + waitStatus

// occupy creates a plain pod (not managed by gputopo) with one claim from
// tmpl held to node, waits until it is bound with its claim allocated, and
// returns the claim. When the test ends the pod is force-deleted and the
// cleanup waits until its claim is gone, so the next test finds the node
// free. No Job of the test may be named a prefix of name: deleteJob waits
// for the claims of every pod named JOB-....
func occupy(t *testing.T, name, tmpl, node string) *resourcev1.ResourceClaim {
	t.Helper()
	p, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), plainPod(name, tmpl, node), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { removePod(t, p.Name, p.UID) })
	var claim *resourcev1.ResourceClaim
	framework.Eventually(t, waitPlaced, "pod "+name+" to be bound to "+node+" with its claim allocated", func() (bool, string) {
		cur, err := client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if cur.Spec.NodeName != node {
			return false, framework.PodState(cur)
		}
		c, err := framework.PodClaim(context.Background(), client, cur, claimName)
		if err != nil || c.Status.Allocation == nil {
			return false, fmt.Sprintf("claim not allocated (%v)", err)
		}
		claim = c
		return true, ""
	})
	return claim
}

// removePod force-deletes a pod and waits until it and the claims it owns
// are gone.
func removePod(t *testing.T, name string, uid types.UID) {
	t.Helper()
	ctx := context.Background()
	err := client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", name, err)
	}
	framework.Eventually(t, waitCleanup, "pod "+name+" and its claims to be gone", func() (bool, string) {
		if p, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{}); err == nil && p.UID == uid {
			return false, "pod still there: " + framework.PodState(p)
		}
		list, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range list.Items {
			for _, ref := range c.OwnerReferences {
				if ref.UID == uid {
					return false, "claim " + c.Name + " still there"
				}
			}
		}
		return true, ""
	})
}

// createJobFrom creates a Job of pods pods with one claim each from tmpl
// and deletes it, its pods and claims when the test ends.
func createJobFrom(t *testing.T, name string, pods int32, tmpl string, ann map[string]string, edit ...func(*batchv1.Job)) *batchv1.Job {
	t.Helper()
	j := newJob(name, pods, tmpl, ann)
	for _, e := range edit {
		e(j)
	}
	job, err := client.BatchV1().Jobs(namespace).Create(framework.Ctx(t), j, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Job %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logJob(t, name)
		}
		deleteJob(t, name)
	})
	return job
}

// bound is where the pods that match a label selector went: each pod
// bound, ungated, with its claim allocated.
type bound struct {
	pods   []corev1.Pod
	claims map[string]*resourcev1.ResourceClaim // by pod name
	nodes  []string                             // pod i's node
	leaves []string                             // sorted, distinct
	domain string                               // pods[0]'s gputopo.dev/domain
}

func (b bound) String() string {
	var parts []string
	for i, p := range b.pods {
		parts = append(parts, p.Name+"→"+b.nodes[i])
	}
	return fmt.Sprintf("domain %q: %s", b.domain, strings.Join(parts, " "))
}

// waitBound waits until n pods match selector, each ungated and bound with
// its claim allocated, and checks they all carry one gputopo.dev/domain.
func waitBound(t *testing.T, selector string, n int) bound {
	t.Helper()
	var b bound
	framework.Eventually(t, waitPlaced, fmt.Sprintf("%d pods %s to be bound with their claims allocated", n, selector), func() (bool, string) {
		b = bound{claims: map[string]*resourcev1.ResourceClaim{}}
		list, err := client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				b.pods = append(b.pods, p)
			}
		}
		if len(b.pods) != n {
			return false, fmt.Sprintf("%d pods", len(b.pods))
		}
		slices.SortFunc(b.pods, func(x, y corev1.Pod) int { return strings.Compare(x.Name, y.Name) })
		for i := range b.pods {
			p := &b.pods[i]
			if hasGate(p) || p.Spec.NodeName == "" {
				return false, "pod " + p.Name + ": " + framework.PodState(p) + " " + p.Annotations[placementapi.AnnotationStatus]
			}
			c, err := framework.PodClaim(context.Background(), client, p, claimName)
			if err != nil || c.Status.Allocation == nil {
				return false, fmt.Sprintf("pod %s: claim not allocated (%v)", p.Name, err)
			}
			b.claims[p.Name] = c
		}
		return true, ""
	})
	leaves := map[string]bool{}
	for i, p := range b.pods {
		b.nodes = append(b.nodes, p.Spec.NodeName)
		leaves[topo.leafOf[p.Spec.NodeName]] = true
		if i == 0 {
			b.domain = p.Annotations[placementapi.AnnotationDomain]
		} else if d := p.Annotations[placementapi.AnnotationDomain]; d != b.domain {
			t.Errorf("pod %s has %s=%q, pod %s %q", p.Name, placementapi.AnnotationDomain, d, b.pods[0].Name, b.domain)
		}
		if got := allocationNode(b.claims[p.Name].Status.Allocation); got != p.Spec.NodeName {
			t.Errorf("pod %s is on %s but its claim is allocated on %q", p.Name, p.Spec.NodeName, got)
		}
	}
	for l := range leaves {
		b.leaves = append(b.leaves, l)
	}
	slices.Sort(b.leaves)
	t.Logf("%s: %s", selector, b)
	return b
}

func jobSelector(job string) string { return batchv1.JobNameLabel + "=" + job }

// withStrategy is placement p with strategy s.
func withStrategy(p placementapi.Placement, s placementapi.Strategy) map[string]string {
	return map[string]string{placementapi.AnnotationPlacement: string(p), placementapi.AnnotationStrategy: string(s)}
}

// TestClaimOnePodFragmentationAware: "a one-pod job that opts in is placed
// by a fragmentation-aware score: of the nodes and GPUs where it fits, the
// one that strands the least free GPU capacity ... Strategy consolidated
// packs (fullest place first), distributed spreads." With four GPUs of one
// node taken, a one-pod Job of four GPUs goes onto the other four (an
// empty node would strand four GPUs for whole-node pods) by default and
// with consolidated, and onto an empty node with distributed.
func TestClaimOnePodFragmentationAware(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	half := topo.leafNodes[leaf][1]
	occupy(t, "occupier-fgd", "gpu-4-nvlink", half)
	for _, tc := range []struct {
		strategy placementapi.Strategy // "" for the default
		onHalf   bool
	}{{"", true}, {placementapi.StrategyConsolidated, true}, {placementapi.StrategyDistributed, false}} {
		name := "fgd-" + string(tc.strategy)
		ann := placed(placementapi.PlacementAuto)
		if tc.strategy == "" {
			name = "fgd-default"
		} else {
			ann[placementapi.AnnotationStrategy] = string(tc.strategy)
		}
		t.Run(name, func(t *testing.T) {
			createJobFrom(t, name, 1, "gpu-4-nvlink", ann)
			b := waitBound(t, jobSelector(name), 1)
			node := b.nodes[0]
			if tc.onHalf && node != half {
				t.Errorf("strategy %q: the one-pod Job went to %s, want %s, the node whose other four GPUs are taken (the place that strands least)", tc.strategy, node, half)
			}
			if !tc.onHalf {
				if node == half {
					t.Errorf("strategy distributed: the one-pod Job went to the partly used node %s, want an empty one", node)
				}
				if others := claimsOnNode(t, node); len(others) != 1 {
					t.Errorf("strategy distributed: node %s holds claims %v, want only the Job's", node, others)
				}
			}
			if want := "node:" + node; b.domain != want {
				t.Errorf("%s=%q, want %q", placementapi.AnnotationDomain, b.domain, want)
			}
		})
	}
}

// claimsOnNode names the allocated claims of the namespace on node.
func claimsOnNode(t *testing.T, node string) []string {
	t.Helper()
	list, err := client.ResourceV1().ResourceClaims(namespace).List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range list.Items {
		if c.Status.Allocation != nil && allocationNode(c.Status.Allocation) == node {
			out = append(out, c.Name)
		}
	}
	return out
}

// TestClaimStrategies: "gputopo.dev/strategy: spread inside the domain:
// consolidated packs pods onto as few nodes as possible, balanced spreads
// pods evenly over the domain's nodes, distributed ... spreads pods across
// the domain's leaves". Two four-GPU pods that must share a spine
// (same-spine, which also proves that placement: the domain is the spine):
// one node with consolidated, two nodes of one leaf with balanced, two
// leaves with distributed.
func TestClaimStrategies(t *testing.T) {
	dumpOnFailure(t)
	for _, tc := range []struct {
		strategy      placementapi.Strategy
		nodes, leaves int
	}{
		{placementapi.StrategyConsolidated, 1, 1},
		{placementapi.StrategyBalanced, 2, 1},
		{placementapi.StrategyDistributed, 2, 2},
	} {
		name := "strategy-" + string(tc.strategy)
		t.Run(string(tc.strategy), func(t *testing.T) {
			createJobFrom(t, name, 2, "gpu-4-nvlink", withStrategy(placementapi.PlacementSameSpine, tc.strategy))
			b := waitBound(t, jobSelector(name), 2)
			nodes := slices.Compact(sortedCopy(b.nodes))
			if len(nodes) != tc.nodes || len(b.leaves) != tc.leaves {
				t.Errorf("strategy %s: pods on nodes %v in leaves %v, want %d node(s) in %d leaf(s)", tc.strategy, nodes, b.leaves, tc.nodes, tc.leaves)
			}
			spine, ok := strings.CutPrefix(b.domain, "spine:")
			if !ok {
				t.Fatalf("same-spine: %s=%q, want spine:<name>", placementapi.AnnotationDomain, b.domain)
			}
			for _, l := range b.leaves {
				if topo.spineOf[l] != spine {
					t.Errorf("same-spine: leaf %s is under %s, not the domain's %s", l, topo.spineOf[l], spine)
				}
			}
			checkHeldTo(t, b, spineNodes(spine))
		})
	}
}

func spineNodes(spine string) []string {
	var out []string
	for _, l := range topo.spineLeaves[spine] {
		out = append(out, topo.leafNodes[l]...)
	}
	return out
}

// checkHeldTo checks that every pod's required node affinity selects
// exactly nodes (by their kubernetes.io/hostname, which the local cluster
// sets to the node's name), as the README says: the scheduler is held to
// the domain by the node affinity the gates open with.
func checkHeldTo(t *testing.T, b bound, nodes []string) {
	t.Helper()
	want := sortedCopy(nodes)
	for _, p := range b.pods {
		if got := hostnameAffinity(&p); !slices.Equal(got, want) {
			t.Errorf("pod %s (domain %q): required node affinity on %s selects %v, want exactly the domain's nodes %v", p.Name, b.domain, corev1.LabelHostname, got, want)
		}
	}
}

// hostnameAffinity returns the hostnames that every term of the pod's
// required node affinity restricts kubernetes.io/hostname to (sorted), nil
// if some term does not restrict it.
func hostnameAffinity(p *corev1.Pod) []string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out []string
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		found := false
		for _, r := range term.MatchExpressions {
			if r.Key == corev1.LabelHostname && r.Operator == corev1.NodeSelectorOpIn {
				found = true
				for _, v := range r.Values {
					if !slices.Contains(out, v) {
						out = append(out, v)
					}
				}
			}
		}
		if !found {
			return nil
		}
	}
	slices.Sort(out)
	return out
}

// TestClaimBestFit: "Among domains of that size it picks the best fit
// (fewest GPUs left free) so whole leaves and whole nodes stay free for
// large jobs." With one node of a leaf taken, a two-node Job goes to that
// leaf (one node left free there, two anywhere else), not to the first
// leaf by name.
func TestClaimBestFit(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	if leaf == topo.leaves[0] {
		t.Fatalf("the suite's topology needs a fake leaf after %s", topo.leaves[0])
	}
	occupy(t, "occupier-bestfit", "gpu-8-node", topo.leafNodes[leaf][0])
	createJob(t, "bestfit", 2, placed(placementapi.PlacementAuto))
	pl := waitJobPlaced(t, "bestfit", 2, waitPlaced)
	if want := "leaf:" + leaf; pl.domain != want {
		t.Errorf("%s=%q, want %q: the leaf with one node taken leaves the fewest GPUs free", placementapi.AnnotationDomain, pl.domain, want)
	}
}

// TestClaimAdjacentLeaves: placement adjacent-leaves "requires a run of
// adjacent leaves under one spine". Five whole-node pods (a leaf holds
// four) get a run of two adjacent leaves under one spine, and every pod's
// node affinity selects exactly those leaves' nodes.
func TestClaimAdjacentLeaves(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "adjacent", 5, placed(placementapi.PlacementAdjacentLeaves))
	pl := waitJobPlaced(t, "adjacent", 5, waitPlaced)
	names, ok := strings.CutPrefix(pl.domain, "leaves:")
	if !ok {
		t.Fatalf("%s=%q, want leaves:<a>,<b>", placementapi.AnnotationDomain, pl.domain)
	}
	run := strings.Split(names, ",")
	if len(run) != 2 {
		t.Fatalf("domain %q: want a run of two leaves", pl.domain)
	}
	spine := topo.spineOf[run[0]]
	order := topo.spineLeaves[spine]
	if topo.spineOf[run[1]] != spine || slices.Index(order, run[1])-slices.Index(order, run[0]) != 1 {
		t.Errorf("domain %q: %s and %s are not adjacent leaves of one spine (%s: %v)", pl.domain, run[0], run[1], spine, order)
	}
	var nodes []string
	for _, l := range run {
		nodes = append(nodes, topo.leafNodes[l]...)
	}
	for _, n := range pl.nodes {
		if !slices.Contains(nodes, n) {
			t.Errorf("pod on %s, outside the domain %q", n, pl.domain)
		}
	}
	checkHeldTo(t, bound{pods: pl.pods, domain: pl.domain}, nodes)
}

// TestClaimPreferredDomain: "gputopo.dev/preferred-domain: leaf or spine to
// try first"; "add preferred-domain-required: "true" to insist". A Job
// that fits in its preferred leaf goes there (not where best fit and names
// would put it); one that does not fit there, with the preference not
// required, is placed in another leaf; the same Job with the preference
// required waits, gated, saying why.
func TestClaimPreferredDomain(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	pref := map[string]string{placementapi.AnnotationPlacement: string(placementapi.PlacementAuto), placementapi.AnnotationPreferredDomain: leaf}

	createJob(t, "pref-fits", 2, pref)
	if pl := waitJobPlaced(t, "pref-fits", 2, waitPlaced); pl.domain != "leaf:"+leaf {
		t.Errorf("Job preferring %s that fits there: %s=%q, want leaf:%s", leaf, placementapi.AnnotationDomain, pl.domain, leaf)
	}
	deleteJob(t, "pref-fits")

	occupy(t, "occupier-pref", "gpu-8-node", topo.leafNodes[leaf][0])
	createJob(t, "pref-falls-back", 4, pref)
	pl := waitJobPlaced(t, "pref-falls-back", 4, waitPlaced)
	if got := wholeLeaf(t, pl); got == leaf {
		t.Errorf("four-pod Job placed in %s, whose free nodes are three", leaf)
	}
	deleteJob(t, "pref-falls-back")

	createJob(t, "pref-required", 4, required(leaf))
	msg := waitStatusReason(t, "pref-required", "Unschedulable")
	if !strings.Contains(msg, leaf) {
		t.Errorf("status of the Job that insists on %s does not name it: %q", leaf, msg)
	}
	noClaimAllocated(t, "pref-required")
}

// TestClaimGroupWithoutJob: "gputopo.dev/group, gputopo.dev/group-size: a
// group of pods without a Job: its name and pod count". Two bare pods of
// one group wait for each other, then go to one leaf as one group: one
// domain, each claim allocated by the controller for group/<name>, and
// each pod held to the leaf's nodes.
func TestClaimGroupWithoutJob(t *testing.T) {
	dumpOnFailure(t)
	const group = "bare-group"
	selector := "e2e.gputopo.dev/group=" + group
	mk := func(i int) *corev1.Pod {
		p := plainPod(fmt.Sprintf("%s-%d", group, i), "gpu-8-node", "")
		p.Spec.NodeSelector = nil
		p.Labels["e2e.gputopo.dev/group"] = group
		p.Annotations = map[string]string{
			placementapi.AnnotationPlacement: string(placementapi.PlacementAuto),
			placementapi.AnnotationGroup:     group,
			placementapi.AnnotationGroupSize: "2",
		}
		return p
	}
	first, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), mk(0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(t, first.Name, first.UID) })
	// One pod of two: it waits for the other, gated, and holds nothing.
	framework.Eventually(t, waitStatus, "the group's first pod to wait for the second", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), first.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _ := placementapi.ParseStatus(p.Annotations[placementapi.AnnotationStatus])
		return hasGate(p) && st.Reason == "WaitingForPods", fmt.Sprintf("gated %v, status %q", hasGate(p), p.Annotations[placementapi.AnnotationStatus])
	})
	second, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), mk(1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(t, second.Name, second.UID) })
	b := waitBound(t, selector, 2)
	if len(b.leaves) != 1 || b.domain != "leaf:"+b.leaves[0] {
		t.Fatalf("group pods in leaves %v with domain %q, want one leaf", b.leaves, b.domain)
	}
	if b.nodes[0] == b.nodes[1] {
		t.Errorf("both whole-node pods on %s", b.nodes[0])
	}
	for name, c := range b.claims {
		if got, want := c.Annotations[placementapi.AnnotationAllocatedBy], namespace+"/group/"+group; got != want {
			t.Errorf("claim of pod %s: %s=%q, want %q", name, placementapi.AnnotationAllocatedBy, got, want)
		}
	}
	checkHeldTo(t, b, topo.leafNodes[b.leaves[0]])
}

// TestClaimDomainAffinityHolds: "the scheduler ... held to the domain by
// the node affinity the gates open with". A two-pod Job placed in a leaf
// of four nodes: each pod's required node affinity selects exactly the
// leaf's nodes; a replacement for a force-deleted pod opens with the same
// affinity and lands inside the leaf, though two nodes of other leaves are
// also empty.
func TestClaimDomainAffinityHolds(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "held", 2, placed(placementapi.PlacementAuto))
	before := waitJobPlaced(t, "held", 2, waitPlaced)
	leaf := before.leaves[0]
	b := bound{pods: before.pods, domain: before.domain}
	checkHeldTo(t, b, topo.leafNodes[leaf])

	victim := before.pods[0]
	forceDeletePod(t, victim.Name)
	var replacement corev1.Pod
	framework.Eventually(t, waitPlaced, "a replacement pod bound", func() (bool, string) {
		pods, err := jobPods(context.Background(), "held")
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if p.UID != victim.UID && p.UID != before.pods[1].UID {
				replacement = p
				return p.Spec.NodeName != "", framework.PodState(&p)
			}
		}
		return false, fmt.Sprintf("%d pods, none new", len(pods))
	})
	if got := topo.leafOf[replacement.Spec.NodeName]; got != leaf {
		t.Errorf("replacement %s went to %s in %s, outside the Job's leaf %s", replacement.Name, replacement.Spec.NodeName, got, leaf)
	}
	checkHeldTo(t, bound{pods: []corev1.Pod{replacement}, domain: before.domain}, topo.leafNodes[leaf])
}

// waitEvent waits for an event of type typ and reason about the object
// (kind, name, uid) and returns its message.
func waitEvent(t *testing.T, kind, name string, uid types.UID, typ, reason string, timeout time.Duration) string {
	t.Helper()
	var msg string
	framework.Eventually(t, timeout, fmt.Sprintf("a %s %s event on %s %s", typ, reason, kind, name), func() (bool, string) {
		events, err := client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "involvedObject.uid": string(uid), "reason": reason}.String(),
		})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Type == typ {
				msg = e.Message
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events of that reason, none %s", len(events.Items), typ)
	})
	return msg
}

// TestClaimEventPlaced: "On the Job ...: Placed". The event names the
// domain the pods carry.
func TestClaimEventPlaced(t *testing.T) {
	dumpOnFailure(t)
	job := createJob(t, "ev-placed", 2, placed(placementapi.PlacementAuto))
	pl := waitJobPlaced(t, "ev-placed", 2, waitPlaced)
	msg := waitEvent(t, "Job", job.Name, job.UID, corev1.EventTypeNormal, "Placed", waitStatus)
	t.Logf("Placed: %s", msg)
	leaf := strings.TrimPrefix(pl.domain, "leaf:")
	if !strings.Contains(msg, leaf) {
		t.Errorf("Placed event %q does not name the domain %q", msg, pl.domain)
	}
}

// TestClaimEventReserved: "Reserved (the first waiting group that does not
// fit reserved nodes to wait for, after --reserve-after ...)". A four-pod
// Job that insists on a leaf where one node is taken waits; after
// --reserve-after (30 s) it reserves the leaf's free nodes, and a Job that
// would fit only there is kept off them and told whose they are.
func TestClaimEventReserved(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	occupy(t, "occupier-reserve", "gpu-8-node", topo.leafNodes[leaf][0])
	job := createJob(t, "reserver", 4, required(leaf))
	waitStatusReason(t, "reserver", "Unschedulable")
	msg := waitEvent(t, "Job", job.Name, job.UID, corev1.EventTypeNormal, "Reserved", waitReserve)
	t.Logf("Reserved: %s", msg)
	if !strings.Contains(msg, leaf) {
		t.Errorf("Reserved event %q does not name the leaf %s", msg, leaf)
	}
	// A one-node Job that insists on that leaf finds its free nodes held.
	createJob(t, "reserved-out", 1, required(leaf))
	got := waitStatusReason(t, "reserved-out", "Unschedulable")
	if !strings.Contains(got, "reserved for "+namespace+"/job/reserver") {
		t.Errorf("Job kept off the reserved nodes says %q, want the reservation named", got)
	}
	noClaimAllocated(t, "reserved-out")
}

// TestClaimEventNotBound: "NotBound (gate open, not bound after
// --bind-timeout)". A pod whose scheduler does not exist is placed and its
// gate opened, but nothing binds it: after --bind-timeout (15 s here,
// rather than the default minute) it gets a NotBound Warning that names
// the timeout.
func TestClaimEventNotBound(t *testing.T) {
	dumpOnFailure(t)
	const timeout = 15 * time.Second
	restartController(t, fmt.Sprintf("--bind-timeout=%s", timeout))
	t.Cleanup(func() { restartController(t) })
	createJobFrom(t, "notbound", 1, "gpu-1", placed(placementapi.PlacementAuto), func(j *batchv1.Job) {
		j.Spec.Template.Spec.SchedulerName = "e2e-no-such-scheduler"
	})
	var pod corev1.Pod
	framework.Eventually(t, waitPlaced, "the pod of notbound to be ungated with its claim allocated", func() (bool, string) {
		pods, err := jobPods(context.Background(), "notbound")
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		pod = pods[0]
		return !hasGate(&pod), framework.PodState(&pod)
	})
	msg := waitEvent(t, "Pod", pod.Name, pod.UID, corev1.EventTypeWarning, "NotBound", timeout+waitStatus)
	t.Logf("NotBound: %s", msg)
	if !strings.Contains(msg, fmt.Sprintf("(timeout %s)", timeout)) {
		t.Errorf("NotBound event %q does not name the timeout %s", msg, timeout)
	}
	if cur, err := client.CoreV1().Pods(namespace).Get(framework.Ctx(t), pod.Name, metav1.GetOptions{}); err == nil && cur.Spec.NodeName != "" {
		t.Errorf("pod %s with no scheduler is bound to %s", pod.Name, cur.Spec.NodeName)
	}
}

// TestClaimEventDeviceConflict: "DeviceConflict (a device of its claim is
// also in another claim; the pod is deleted so its workload replaces it)".
// Another claim is written with the device of a placed pod that has not
// started (its node is fake): the pod gets a DeviceConflict Warning and is
// deleted, and the controller counts the conflict.
func TestClaimEventDeviceConflict(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	createJobFrom(t, "conflict", 1, "gpu-1", required(leaf))
	b := waitBound(t, jobSelector("conflict"), 1)
	pod, claim := b.pods[0], b.claims[b.pods[0].Name]
	res := claim.Status.Allocation.Devices.Results[0]
	before := deviceConflicts(t)

	// The other claim, allocated by hand on the same device.
	other := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "conflict-other", Namespace: namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gputopology.DriverName},
		}}}},
	}
	created, err := client.ResourceV1().ResourceClaims(namespace).Create(framework.Ctx(t), other, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceClaims(namespace).Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	created.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: res.Driver, Pool: res.Pool, Device: res.Device,
		}}},
		NodeSelector: claim.Status.Allocation.NodeSelector,
	}
	if _, err := client.ResourceV1().ResourceClaims(namespace).UpdateStatus(framework.Ctx(t), created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim %s on %s/%s: %v", created.Name, res.Pool, res.Device, err)
	}
	msg := waitEvent(t, "Pod", pod.Name, pod.UID, corev1.EventTypeWarning, "DeviceConflict", waitStatus)
	t.Logf("DeviceConflict: %s", msg)
	if !strings.Contains(msg, res.Device) || !strings.Contains(msg, created.Name) {
		t.Errorf("DeviceConflict event %q does not name device %s and claim %s", msg, res.Device, created.Name)
	}
	framework.Eventually(t, waitStatus, "pod "+pod.Name+" to be deleted", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && (p.UID != pod.UID || p.DeletionTimestamp != nil) {
			return true, ""
		}
		return false, fmt.Sprintf("pod still there (%v)", err)
	})
	if after := deviceConflicts(t); after <= before {
		t.Errorf("gputopo_controller_device_conflicts_total is %v, was %v before the conflict", after, before)
	}
	// Free the device before the Job's replacement is planned onto it again.
	if err := client.ResourceV1().ResourceClaims(namespace).Delete(framework.Ctx(t), created.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete claim %s: %v", created.Name, err)
	}
}

func deviceConflicts(t *testing.T) float64 {
	t.Helper()
	m, err := scrapeMetrics(framework.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return m["gputopo_controller_device_conflicts_total"]
}
