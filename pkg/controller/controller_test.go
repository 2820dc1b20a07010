package controller

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Test cluster: one spine, two leaves of two dgx-h100 nodes each.
//
//	spine-0
//	├── leaf-0: n0 n1
//	└── leaf-1: n2 n3
func testObjects(t testing.TB) []any {
	t.Helper()
	var objs []any
	p, err := sim.LoadBuiltin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		objs = append(objs, gpuNode(t, p, fmt.Sprintf("n%d", i), fmt.Sprintf("leaf-%d", i/2), slices.DefaultConfig())...)
	}
	dc, err := specs.DeviceClass()
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, dc)
	for _, name := range []string{"gpu-8-node", "gpu-4-nvlink", "gpu-1"} {
		tmpl, err := specs.ClaimTemplate(name)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.Namespace = "default"
		objs = append(objs, tmpl)
	}
	return objs
}

// gpuNode is a Ready node of profile p in leaf of spine-0, with the
// slices its kubelet plugin publishes under cfg.
func gpuNode(t testing.TB, p *sim.Profile, name, leaf string, cfg slices.Config) []any {
	t.Helper()
	labels := map[string]string{topology.LabelTopographLeaf: leaf, topology.LabelTopographSpine: "spine-0", v1.LabelHostname: "host-" + name}
	objs := []any{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: v1.NodeStatus{
			Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
			Allocatable: v1.ResourceList{v1.ResourcePods: resource.MustParse("110"), v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi")},
		}}}
	res, err := slices.Build(p.Inventory(name), slices.Node{Name: name, Labels: labels}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Objects(name, res) {
		objs = append(objs, s)
	}
	return objs
}

type harness struct {
	t      testing.TB
	ctx    context.Context
	client *fake.Clientset
	c      *Controller
	// edit changes the controller's configuration before it starts.
	edit func(*Config)
}

func newHarness(t *testing.T, extra ...any) *harness {
	return newHarnessWith(t, nil, extra...)
}

// newHarnessWith is newHarness with hook, when set, run on the harness
// before any object is created and the informers start (reactors).
func newHarnessWith(t *testing.T, hook func(*harness), extra ...any) *harness {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	client := fake.NewClientset()
	// The API server serves DeviceTaintRules, as 1.37 does by default.
	client.Resources = []*metav1.APIResourceList{{GroupVersion: resourceapi.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "devicetaintrules", Kind: "DeviceTaintRule"}}}}
	h := &harness{t: t, ctx: ctx, client: client}
	if hook != nil {
		hook(h)
	}
	for _, o := range append(testObjects(t), extra...) {
		h.create(o)
	}
	h.start()
	return h
}

// start runs the controller's informers on the harness's client.
func (h *harness) start() {
	t, ctx, client := h.t, h.ctx, h.client
	cfg := Config{Client: client, Network: topology.DefaultLabelMapping()}
	if h.edit != nil {
		h.edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.startInformers(ctx); err != nil {
		t.Fatal(err)
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		t.Fatal("caches did not sync")
	}
	h.c = c
}

func (h *harness) create(o any) {
	h.t.Helper()
	var err error
	switch o := o.(type) {
	case *v1.Node:
		_, err = h.client.CoreV1().Nodes().Create(h.ctx, o, metav1.CreateOptions{})
	case *v1.Namespace:
		_, err = h.client.CoreV1().Namespaces().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceSlice:
		_, err = h.client.ResourceV1().ResourceSlices().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.DeviceTaintRule:
		_, err = h.client.ResourceV1().DeviceTaintRules().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.DeviceClass:
		_, err = h.client.ResourceV1().DeviceClasses().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaimTemplate:
		_, err = h.client.ResourceV1().ResourceClaimTemplates(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaim:
		_, err = h.client.ResourceV1().ResourceClaims(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *batchv1.Job:
		_, err = h.client.BatchV1().Jobs(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *v1.Pod:
		_, err = h.client.CoreV1().Pods(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *v1.PersistentVolumeClaim:
		_, err = h.client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *v1.PersistentVolume:
		_, err = h.client.CoreV1().PersistentVolumes().Create(h.ctx, o, metav1.CreateOptions{})
	case *storagev1.StorageClass:
		_, err = h.client.StorageV1().StorageClasses().Create(h.ctx, o, metav1.CreateOptions{})
	case *schedulingv1beta1.PodGroup:
		_, err = h.client.SchedulingV1beta1().PodGroups(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	default:
		h.t.Fatalf("unknown object %T", o)
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

func job(name string, pods int32) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: batchv1.JobSpec{Parallelism: ptr.To(pods), Completions: ptr.To(pods)}}
}

// jobPod is a gated pod of job with one claim from template.
func jobPod(jobName string, i int, template string, ann map[string]string) *v1.Pod {
	a := map[string]string{placement.AnnotationPlacement: "auto"}
	for k, v := range ann {
		a[k] = v
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%d", jobName, i), Namespace: "default", UID: types.UID(fmt.Sprintf("%s-%d", jobName, i)),
			Annotations:     a,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: jobName, UID: types.UID("uid-" + jobName), Controller: ptr.To(true)}},
		},
		Spec: v1.PodSpec{
			SchedulingGates: []v1.PodSchedulingGate{{Name: placement.SchedulingGate}},
			Containers:      []v1.Container{{Name: "c", Image: "img"}},
			ResourceClaims:  []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(template)}},
		},
	}
}

// addPod creates the pod and, as the resource claim controller would, its
// claim "<pod>-gpus" from the template, recorded in the pod's status.
func (h *harness) addPod(p *v1.Pod) {
	h.t.Helper()
	h.create(p)
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil {
			continue // a claim of the user's, created by the test
		}
		tmpl, err := h.client.ResourceV1().ResourceClaimTemplates(p.Namespace).Get(h.ctx, *rc.ResourceClaimTemplateName, metav1.GetOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		name := p.Name + "-" + rc.Name
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.Namespace, UID: types.UID("claim-" + name),
				Annotations:     map[string]string{"resource.kubernetes.io/pod-claim-name": rc.Name},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}},
			Spec: *devicefit.Defaulted(&tmpl.Spec.Spec),
		}
		h.create(claim)
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, v1.PodResourceClaimStatus{Name: rc.Name, ResourceClaimName: ptr.To(name)})
	}
	if _, err := h.client.CoreV1().Pods(p.Namespace).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// eventually waits until the informers show what cond wants.
func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("informers never showed %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sync runs syncs of the group, as the queue would, until its pods'
// gates are open or nothing changes any more.
func (h *harness) sync(key string) {
	h.t.Helper()
	for range 4 {
		if _, err := h.c.sync(h.ctx, key); err != nil {
			h.t.Fatalf("sync %s: %v", key, err)
		}
		h.settle()
	}
}

// allocate syncs the group once: its plan is written into its claims,
// and its gates stay closed until the next sync.
func (h *harness) allocate(key string) {
	h.t.Helper()
	h.settle()
	if _, err := h.c.sync(h.ctx, key); err != nil {
		h.t.Fatalf("sync %s: %v", key, err)
	}
	h.settle()
}

// place syncs the group, waits out the settle delay and syncs it again,
// so its gates open.
func (h *harness) place(key string) {
	h.t.Helper()
	h.sync(key)
	time.Sleep(h.c.cfg.SettleDelay)
	h.sync(key)
}

// settle waits until the informers show every write so far.
func (h *harness) settle() {
	h.t.Helper()
	h.eventually("the controller's writes", func() bool {
		pods, _ := h.client.CoreV1().Pods("").List(h.ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			seen, err := h.c.pods.Pods(p.Namespace).Get(p.Name)
			if err != nil || seen.ResourceVersion != p.ResourceVersion || !maps.Equal(seen.Annotations, p.Annotations) || len(seen.Spec.SchedulingGates) != len(p.Spec.SchedulingGates) ||
				seen.Spec.NodeName != p.Spec.NodeName || len(seen.Status.ResourceClaimStatuses) != len(p.Status.ResourceClaimStatuses) {
				return false
			}
		}
		claims, _ := h.client.ResourceV1().ResourceClaims("").List(h.ctx, metav1.ListOptions{})
		for _, c := range claims.Items {
			seen, err := h.c.claims.ResourceClaims(c.Namespace).Get(c.Name)
			if err != nil || !equality.Semantic.DeepEqual(seen.Status, c.Status) || !maps.Equal(seen.Annotations, c.Annotations) {
				return false
			}
			// The informer's store is updated before its handlers run:
			// the claim index, which a sync reads for clashes, may lag.
			if !h.c.index.seen(c.UID, c.ResourceVersion) {
				return false
			}
		}
		return true
	})
}

// drain takes every key out of the group queue, forgetting its backoff,
// and returns them in the queue's order.
func (h *harness) drain() []string {
	var keys []string
	for h.c.queue.Len() > 0 {
		k, _ := h.c.queue.Get()
		keys = append(keys, k)
		h.c.queue.Forget(k)
		h.c.queue.Done(k)
	}
	return keys
}

func (h *harness) pod(name string) *v1.Pod {
	h.t.Helper()
	p, err := h.client.CoreV1().Pods("default").Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *harness) claim(name string) *resourceapi.ResourceClaim {
	h.t.Helper()
	c, err := h.client.ResourceV1().ResourceClaims("default").Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// allocatedNode is the node the pod's claim is allocated on, "" if none.
func (h *harness) allocatedNode(pod string) string {
	return allocationNode(h.claim(pod + "-gpus").Status.Allocation)
}

// bind does what the scheduler does for a pod whose claim is allocated:
// reserve the claim for it and bind it to the allocation's node.
func (h *harness) bind(pod string) {
	h.t.Helper()
	c := h.claim(pod + "-gpus")
	p := h.pod(pod)
	node := allocationNode(c.Status.Allocation)
	if node == "" || hasGate(p) {
		h.t.Fatalf("pod %s cannot be bound: node %q, gated %v", pod, node, hasGate(p))
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: p.UID}}
	if _, err := h.client.ResourceV1().ResourceClaims("default").UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	p.Spec.NodeName = node
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.settle()
}

// postFilter does what the scheduler's DynamicResources PostFilter does
// for an ungated pod that fits nowhere: it takes back the allocation of a
// claim reserved for that pod alone.
func (h *harness) postFilter(pod string) {
	h.t.Helper()
	c := h.claim(pod + "-gpus")
	p := h.pod(pod)
	if len(c.Status.ReservedFor) > 1 || (len(c.Status.ReservedFor) == 1 && c.Status.ReservedFor[0].UID != p.UID) {
		h.t.Fatalf("claim of %s is reserved for others: %v", pod, c.Status.ReservedFor)
	}
	c.Status.Allocation, c.Status.ReservedFor = nil, nil
	if _, err := h.client.ResourceV1().ResourceClaims("default").UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.settle()
}

// devicesOf lists the devices allocated to the pod's claim.
func (h *harness) devicesOf(pod string) []string {
	var out []string
	for _, d := range exclusiveDevices(h.claim(pod + "-gpus").Status.Allocation) {
		out = append(out, d.String())
	}
	return out
}

// foreignClaim is a claim the scheduler allocated for an unmanaged pod.
func foreignClaim(name, node string, devices ...string) *resourceapi.ResourceClaim {
	var results []resourceapi.DeviceRequestAllocationResult
	for _, d := range devices {
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: topology.DriverName, Pool: node, Device: d})
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("claim-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
			NodeSelector: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}},
		}},
	}
}

func gpus(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("gpu-%d", i)
	}
	return out
}

// DeviceTaintRules are watched where the API server serves them in v1
// (1.37), ignored where it serves none (1.36 by default), and the
// controller refuses to start, naming the gate, where it serves them only
// in v1beta2 (1.36 with DRADeviceTaintRules on): kube-scheduler would
// apply rules the controller cannot see.
func TestServesDeviceTaintRules(t *testing.T) {
	rules := []metav1.APIResource{{Name: "devicetaintrules", Kind: "DeviceTaintRule"}}
	for _, tc := range []struct {
		name    string
		served  []*metav1.APIResourceList
		want    bool
		wantErr string
	}{
		{"v1 (1.37)", []*metav1.APIResourceList{{GroupVersion: "resource.k8s.io/v1", APIResources: rules}}, true, ""},
		{"v1 and v1beta2", []*metav1.APIResourceList{{GroupVersion: "resource.k8s.io/v1", APIResources: rules}, {GroupVersion: "resource.k8s.io/v1beta2", APIResources: rules}}, true, ""},
		{"none (1.36 by default)", []*metav1.APIResourceList{{GroupVersion: "resource.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "resourceslices"}}}}, false, ""},
		{"v1beta2 only (1.36 with the gate on)", []*metav1.APIResourceList{{GroupVersion: "resource.k8s.io/v1beta2", APIResources: rules}}, false, "turn DRADeviceTaintRules off, or upgrade to Kubernetes 1.37"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.Resources = tc.served
			got, err := servesDeviceTaintRules(client)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("servesDeviceTaintRules = %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("servesDeviceTaintRules = %v, %v; want %v, nil", got, err, tc.want)
			}
		})
	}
}
