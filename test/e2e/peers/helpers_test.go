package peers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// Waits are generous: the machine is slow and shared; each returns as soon
// as its condition holds.
const (
	waitPlaced  = 3 * time.Minute
	waitCleanup = 3 * time.Minute
)

// kueueFinalizer is the finalizer Kueue's pod integration puts on pods.
const kueueFinalizer = "kueue.x-k8s.io/managed"

// claimName is the pod-level name of every test pod's one claim.
const claimName = "gpus"

// Resources the tests create, by kind.
var (
	gvrJobSet        = schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}
	gvrLWS           = schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}
	gvrResource      = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
	gvrClusterQueue  = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	gvrLocalQueue    = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
	gvrWorkload      = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
	gvrJob           = schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	gvrPod           = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	resourceByKind   = map[string]schema.GroupVersionResource{"JobSet": gvrJobSet, "LeaderWorkerSet": gvrLWS, "ResourceFlavor": gvrResource, "ClusterQueue": gvrClusterQueue, "LocalQueue": gvrLocalQueue, "Job": gvrJob, "Pod": gvrPod}
	clusterScopedSet = map[string]bool{"ResourceFlavor": true, "ClusterQueue": true}
)

// readObjects decodes the objects of a testdata file.
func readObjects(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if u.Object != nil {
			out = append(out, u)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no objects in testdata/%s", file)
	}
	return out
}

// create creates obj (in the suite's namespace unless cluster-scoped) and
// deletes it when the test ends, its pods with it.
func create(t *testing.T, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	gvr, ok := resourceByKind[obj.GetKind()]
	if !ok {
		t.Fatalf("no resource for kind %s", obj.GetKind())
	}
	ri := dyn.Resource(gvr)
	if clusterScopedSet[obj.GetKind()] {
		got, err := ri.Create(framework.Ctx(t), obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		t.Cleanup(func() { _ = ri.Delete(framework.Ctx(t), obj.GetName(), metav1.DeleteOptions{}) })
		return got
	}
	nri := ri.Namespace(namespace)
	got, err := nri.Create(framework.Ctx(t), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
	t.Cleanup(func() { deleteAndWait(t, gvr, obj.GetName()) })
	return got
}

// deleteAndWait deletes an object in the foreground and force-deletes its
// pods, which never finish on fake nodes, until no pod of the suite's
// namespace is left and every claim is gone.
func deleteAndWait(t *testing.T, gvr schema.GroupVersionResource, name string) {
	// A context per request: this runs in cleanups, after the test's own
	// contexts, and longer than one request may take.
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 30*time.Second)
	}
	ctx, cancel := call()
	err := dyn.Resource(gvr).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	cancel()
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %s %s: %v", gvr.Resource, name, err)
	}
	framework.Eventually(t, waitCleanup, "the pods and claims of "+name+" to go", func() (bool, string) {
		ctx, cancel := call()
		defer cancel()
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			_ = client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			// Kueue takes its finalizer off a pod once the pod has
			// terminated, which no kubelet ever reports on a fake node.
			if p.DeletionTimestamp != nil && slices.Contains(p.Finalizers, kueueFinalizer) {
				_, _ = client.CoreV1().Pods(namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
		}
		claims, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range pods.Items {
			left = append(left, fmt.Sprintf("pod %s (finalizers %v)", p.Name, p.Finalizers))
		}
		for _, c := range claims.Items {
			left = append(left, fmt.Sprintf("claim %s (finalizers %v)", c.Name, c.Finalizers))
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// waitBound waits until want pods match selector, each bound to a node with
// no scheduling gate left, and returns them.
func waitBound(t *testing.T, selector string, want int) []corev1.Pod {
	t.Helper()
	var bound []corev1.Pod
	framework.Eventually(t, waitPlaced, fmt.Sprintf("%d pods (%s) bound", want, selector), func() (bool, string) {
		pods, err := client.CoreV1().Pods(namespace).List(framework.Ctx(t), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		bound = bound[:0]
		var states []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			if p.Spec.NodeName != "" && len(p.Spec.SchedulingGates) == 0 {
				bound = append(bound, p)
			}
			states = append(states, p.Name+": "+framework.PodState(&p)+" "+p.Annotations[placementapi.AnnotationStatus])
		}
		return len(bound) == want && len(pods.Items) == want, strings.Join(states, "\n")
	})
	return bound
}

// leafOf returns the leaf of each node.
func leafOf(t *testing.T) map[string]string {
	t.Helper()
	nodes, err := client.CoreV1().Nodes().List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		out[n.Name] = n.Labels[cluster.LabelLeaf]
	}
	return out
}

// oneLeaf checks that the pods are on distinct nodes of one leaf and returns it.
func oneLeaf(t *testing.T, pods []corev1.Pod) string {
	t.Helper()
	leaves := leafOf(t)
	seen := map[string]bool{}
	var in []string
	for _, p := range pods {
		if seen[p.Spec.NodeName] {
			t.Errorf("two pods on node %s, each asked for all eight GPUs", p.Spec.NodeName)
		}
		seen[p.Spec.NodeName] = true
		if l := leaves[p.Spec.NodeName]; !slices.Contains(in, l) {
			in = append(in, l)
		}
	}
	if len(in) != 1 {
		var where []string
		for _, p := range pods {
			where = append(where, p.Name+"→"+p.Spec.NodeName)
		}
		t.Fatalf("pods span leaves %v, want one: %s", in, strings.Join(where, ", "))
	}
	return in[0]
}

// checkClaims checks that each pod's claim was allocated by gputopo for
// group (namespace/kind/name) on the pod's node, and returns the claims'
// creation times.
func checkClaims(t *testing.T, pods []corev1.Pod, group string) []time.Time {
	t.Helper()
	var created []time.Time
	for _, p := range pods {
		claim, err := framework.PodClaim(framework.Ctx(t), client, &p, claimName)
		if err != nil {
			t.Fatal(err)
		}
		if got := claim.Annotations[placementapi.AnnotationAllocatedBy]; got != group {
			t.Errorf("claim %s of pod %s: %s=%q, want %q", claim.Name, p.Name, placementapi.AnnotationAllocatedBy, got, group)
		}
		if claim.Status.Allocation == nil {
			t.Errorf("claim %s of pod %s is not allocated", claim.Name, p.Name)
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Pool != p.Spec.NodeName {
				t.Errorf("claim %s of pod %s on %s holds device %s/%s of another node", claim.Name, p.Name, p.Spec.NodeName, r.Pool, r.Device)
			}
		}
		created = append(created, claim.CreationTimestamp.Time)
	}
	return created
}
