package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// Timeouts: the machine is slow and the kubelet polls, so waits are generous.
const (
	waitShort = 60 * time.Second
	waitLong  = 90 * time.Second
)

// cdiKind is the CDI kind of gputopo's devices: gputopo.dev/gpu=<claimUID>-gpu-N.
const cdiKind = "gputopo.dev/gpu"

// node returns the first node of the suite's topology with profile, real
// (with a kubelet and the plugin) or fake.
func node(t *testing.T, profile string, real bool) cluster.NodeInfo {
	t.Helper()
	for _, n := range lc.Nodes() {
		if n.Profile == profile && n.Real == real {
			return n
		}
	}
	t.Fatalf("testdata/topology.yaml has no %s node with profile %s", map[bool]string{true: "real", false: "fake"}[real], profile)
	return cluster.NodeInfo{}
}

// dumpOnFailure logs the tail of the node's plugin and kubelet logs and the
// scheduler's if the test fails.
func dumpOnFailure(t *testing.T, nodes ...string) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		procs := []string{"kube-scheduler"}
		for _, n := range nodes {
			if isReal(n) {
				procs = append(procs, "plugin-"+n, "kubelet-"+n)
			}
		}
		for _, p := range procs {
			t.Logf("----- %s (tail) -----\n%s", lc.LogPath(p), framework.Tail(lc.LogPath(p), 30))
		}
	})
}

// ---- pods and claims ----

// createPod creates a pod in the suite's namespace whose one container
// uses one claim from the demo claim template tmpl, and which only node can
// run (nodeSelector, so the scheduler still allocates the claim). The pod
// is deleted when the test ends.
func createPod(t *testing.T, name, node, tmpl string) *corev1.Pod {
	t.Helper()
	if templates[tmpl] == nil {
		t.Fatalf("no claim template %q in demo/specs/claims", tmpl)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "gputopo-e2e"}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(tmpl)}},
		},
	}
	created, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
	return created
}

func getPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := client.CoreV1().Pods(namespace).Get(framework.Ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

// waitRunning waits for a pod to be Running.
func waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	framework.Eventually(t, waitLong, "pod "+name+" to be Running", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning, framework.PodState(p)
	})
	return pod
}

// waitAllocated waits until the pod is bound to node and its claim is
// allocated, and returns the claim.
func waitAllocated(t *testing.T, name, node string) *resourcev1.ResourceClaim {
	t.Helper()
	var claim *resourcev1.ResourceClaim
	framework.Eventually(t, waitLong, "pod "+name+" to be bound with its claim allocated", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName == "" {
			return false, framework.PodState(p)
		}
		if p.Spec.NodeName != node {
			t.Fatalf("pod %s is bound to %s, want %s", name, p.Spec.NodeName, node)
		}
		c, err := podClaim(p)
		if err != nil {
			return false, err.Error()
		}
		claim = c
		return c.Status.Allocation != nil, "claim " + c.Name + " not allocated"
	})
	return claim
}

// podClaim returns the claim generated for the pod's one resource claim.
func podClaim(p *corev1.Pod) (*resourcev1.ResourceClaim, error) {
	return framework.PodClaim(context.Background(), client, p, "gpus")
}

// waitUnschedulable waits until the scheduler has declared the pod
// unschedulable, in its PodScheduled condition and a FailedScheduling
// event, and returns both messages.
func waitUnschedulable(t *testing.T, name string) (condition, event string) {
	t.Helper()
	framework.Eventually(t, waitLong, "pod "+name+" to be reported unschedulable", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s was scheduled to %s, want it unschedulable", name, p.Spec.NodeName)
		}
		condition = ""
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				condition = c.Message
			}
		}
		if condition == "" {
			return false, framework.PodState(p)
		}
		events, err := client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": name, "involvedObject.uid": string(p.UID), "reason": "FailedScheduling"}.String(),
		})
		if err != nil {
			return false, err.Error()
		}
		if len(events.Items) == 0 {
			return false, "condition says " + condition + "; no FailedScheduling event yet"
		}
		event = events.Items[len(events.Items)-1].Message
		return true, ""
	})
	return condition, event
}

// deletePod deletes a pod with grace period 0 (pods on fake nodes would
// never finish a graceful deletion) and waits until it is gone, its
// generated claim is gone (its devices free for the scheduler) and, on a
// real node, the plugin has unprepared the claim (its devices free for the
// plugin). Deleting a pod that does not exist is fine.
func deletePod(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLong)
	defer cancel()
	p, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("get pod %s for deletion: %v", name, err)
		return
	}
	claim, _ := podClaim(p)
	err = client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", name, err)
		return
	}
	framework.Eventually(t, waitLong, "pod "+name+" to be deleted", func() (bool, string) {
		_, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	})
	if claim == nil {
		return
	}
	framework.Eventually(t, waitLong, "claim "+claim.Name+" of deleted pod "+name+" to be deleted", func() (bool, string) {
		c, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && c.UID != claim.UID) {
			return true, ""
		}
		return false, fmt.Sprintf("claim %+v, err %v", c.ObjectMeta, err)
	})
	if n := p.Spec.NodeName; n != "" && isReal(n) {
		waitUnprepared(t, n, string(claim.UID))
	}
}

// waitUnprepared waits until the node's plugin has forgotten a claim: no
// checkpoint entry and no CDI spec mentions it.
func waitUnprepared(t *testing.T, node, claimUID string) {
	t.Helper()
	framework.Eventually(t, waitLong, "claim "+claimUID+" to be unprepared on "+node, func() (bool, string) {
		return framework.Unprepared(lc, node, claimUID)
	})
}

func isReal(node string) bool { return suite.IsReal(node) }

// allocatedDevices returns the device names allocated to a claim, sorted
// by index, after checking that they are all gputopo devices of node.
func allocatedDevices(t *testing.T, claim *resourcev1.ResourceClaim, node string) []string {
	t.Helper()
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s is not allocated", claim.Name)
	}
	var names []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != topology.DriverName || r.Pool != node {
			t.Errorf("claim %s got device %s/%s/%s, want one of driver %s in pool %s", claim.Name, r.Driver, r.Pool, r.Device, topology.DriverName, node)
		}
		names = append(names, r.Device)
	}
	sortByIndex(names)
	return names
}

// deviceIndex parses the index of a device named gpu-<index>.
func deviceIndex(t *testing.T, name string) int {
	t.Helper()
	i, err := strconv.Atoi(strings.TrimPrefix(name, "gpu-"))
	if err != nil || !strings.HasPrefix(name, "gpu-") {
		t.Fatalf("device name %q is not gpu-<index>", name)
	}
	return i
}

func indexes(t *testing.T, names []string) []int {
	t.Helper()
	out := make([]int, 0, len(names))
	for _, n := range names {
		out = append(out, deviceIndex(t, n))
	}
	return out
}

func sortByIndex(names []string) {
	key := func(n string) int {
		i, err := strconv.Atoi(strings.TrimPrefix(n, "gpu-"))
		if err != nil {
			return 1 << 30
		}
		return i
	}
	sort.Slice(names, func(i, j int) bool {
		if a, b := key(names[i]), key(names[j]); a != b {
			return a < b
		}
		return names[i] < names[j]
	})
}

// ---- ResourceSlices ----

// nodeSlices returns the node's current gputopo ResourceSlices: those of
// the pool's newest generation.
func nodeSlices(ctx context.Context, node string) ([]resourcev1.ResourceSlice, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: topology.DriverName}.String(),
	})
	if err != nil {
		return nil, err
	}
	var gen int64 = -1
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var out []resourcev1.ResourceSlice
	for _, s := range list.Items {
		if s.Spec.Pool.Generation == gen {
			out = append(out, s)
		}
	}
	return out, nil
}

// nodeDevices returns the node's published devices by name.
func nodeDevices(t *testing.T, node string) map[string]resourcev1.Device {
	t.Helper()
	slices, err := nodeSlices(framework.Ctx(t), node)
	if err != nil {
		t.Fatalf("list ResourceSlices of %s: %v", node, err)
	}
	if len(slices) == 0 {
		t.Fatalf("node %s has no ResourceSlice", node)
	}
	return devicesOf(slices)
}

func devicesOf(slices []resourcev1.ResourceSlice) map[string]resourcev1.Device {
	out := map[string]resourcev1.Device{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

// attr returns a device attribute published in gputopo's domain (or a
// fully qualified one such as resource.kubernetes.io/pcieRoot).
func attr(d resourcev1.Device, name string) (resourcev1.DeviceAttribute, bool) {
	if a, ok := d.Attributes[resourcev1.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourcev1.QualifiedName(topology.DriverName+"/"+name)]
	return a, ok
}

// stringAttr returns a string attribute, "" when absent.
func stringAttr(d resourcev1.Device, name string) string {
	if a, ok := attr(d, name); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// uuidsOf returns the uuid attributes of the named devices.
func uuidsOf(t *testing.T, devices map[string]resourcev1.Device, names []string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		d, ok := devices[n]
		if !ok {
			t.Fatalf("device %s is not published", n)
		}
		u := stringAttr(d, topology.AttrUUID)
		if u == "" {
			t.Fatalf("device %s has no uuid attribute", n)
		}
		out = append(out, u)
	}
	return out
}

// ---- plugin state on a real node ----

func loadCheckpoint(t *testing.T, node string) *checkpoint.Checkpoint {
	t.Helper()
	cp, err := framework.LoadCheckpoint(lc, node)
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// findCDISpec finds the CDI spec of a claim on a real node.
func findCDISpec(node, claimUID string) (string, *cdispec.Spec, error) {
	return framework.FindCDISpec(lc, node, claimUID)
}

// envOf returns the value of a variable in a list of KEY=VALUE and how
// often it is set.
func envOf(env []string, key string) (string, int) {
	var v string
	n := 0
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
			n++
		}
	}
	return v, n
}

// prepared is what TestPrepareCDI checks for a pod on a real node.
type prepared struct {
	pod      *corev1.Pod
	claim    *resourcev1.ResourceClaim
	devices  []string // allocated device names
	uuids    []string // their uuid attributes, in the same order
	specPath string   // the claim's CDI spec file
}

// verifyPrepared checks everything that preparing a running pod's claim
// must have produced on its real node: the container that reached the
// runtime got exactly the claim's CDI devices, the claim's CDI spec sets
// NVIDIA_VISIBLE_DEVICES to exactly the allocated GPUs' UUIDs (from the
// node's ResourceSlice), and the checkpoint records the claim as
// PrepareCompleted with those devices.
func verifyPrepared(t *testing.T, podName, node string) prepared {
	t.Helper()
	pod := waitRunning(t, podName)
	if pod.Spec.NodeName != node {
		t.Fatalf("pod %s runs on %s, want %s", podName, pod.Spec.NodeName, node)
	}
	claim, err := podClaim(pod)
	if err != nil {
		t.Fatal(err)
	}
	uid := string(claim.UID)
	devs := allocatedDevices(t, claim, node)
	uuids := uuidsOf(t, nodeDevices(t, node), devs)
	var wantIDs []string
	for _, d := range devs {
		wantIDs = append(wantIDs, cdiKind+"="+uid+"-"+d)
	}

	// What reached the container runtime.
	recs, err := lc.ContainerRecords(node)
	if err != nil {
		t.Fatal(err)
	}
	var rec *cluster.Record
	for i := range recs {
		if recs[i].PodUID == string(pod.UID) && recs[i].Container == "c" {
			rec = &recs[i]
		}
	}
	if rec == nil {
		t.Fatalf("the fake CRI of %s saw no CreateContainer for pod %s (uid %s)", node, podName, pod.UID)
	}
	if got := sortedCopy(rec.CDIDevices); !slices.Equal(got, sortedCopy(wantIDs)) {
		t.Errorf("container of pod %s got CDI devices %v, want %v", podName, got, sortedCopy(wantIDs))
	}

	// The CDI spec on the node.
	path, spec, err := findCDISpec(node, uid)
	if err != nil {
		t.Fatalf("CDI spec of claim %s: %v", uid, err)
	}
	if spec.Kind != cdiKind {
		t.Errorf("CDI spec %s has kind %q, want %q", path, spec.Kind, cdiKind)
	}
	var specDevs []string
	for _, d := range spec.Devices {
		specDevs = append(specDevs, cdiKind+"="+d.Name)
		// Each device also names its GPU: GPUTOPO_DEVICE_GPU_<N>=<UUID>.
		dev := strings.TrimPrefix(d.Name, uid+"-")
		if i := slices.Index(devs, dev); i >= 0 {
			key := "GPUTOPO_DEVICE_" + strings.ToUpper(strings.ReplaceAll(dev, "-", "_"))
			if v, _ := envOf(d.ContainerEdits.Env, key); v != uuids[i] {
				t.Errorf("CDI device %s: %s=%q, want %q (env %v)", d.Name, key, v, uuids[i], d.ContainerEdits.Env)
			}
		}
	}
	if got := sortedCopy(specDevs); !slices.Equal(got, sortedCopy(wantIDs)) {
		t.Errorf("CDI spec %s defines devices %v, want %v", path, got, sortedCopy(wantIDs))
	}
	visible, n := envOf(spec.ContainerEdits.Env, topology.EnvVisibleDevices)
	if n != 1 {
		t.Errorf("CDI spec %s sets %s %d times, want once (env %v)", path, topology.EnvVisibleDevices, n, spec.ContainerEdits.Env)
	}
	if got := sortedCopy(strings.Split(visible, ",")); !slices.Equal(got, sortedCopy(uuids)) {
		t.Errorf("CDI spec %s: %s=%q, want exactly the UUIDs %v of %v", path, topology.EnvVisibleDevices, visible, uuids, devs)
	}
	if v, _ := envOf(spec.ContainerEdits.Env, topology.EnvNode); v != node {
		t.Errorf("CDI spec %s: %s=%q, want %q", path, topology.EnvNode, v, node)
	}

	// The checkpoint.
	cp := loadCheckpoint(t, node)
	c, ok := cp.Claims[uid]
	if !ok {
		t.Fatalf("checkpoint of %s does not list claim %s; it has %v", node, uid, mapsKeys(cp.Claims))
	}
	if c.State != checkpoint.PrepareCompleted {
		t.Errorf("checkpoint state of claim %s = %s, want %s", uid, c.State, checkpoint.PrepareCompleted)
	}
	var ckDevs []string
	for _, d := range c.Devices {
		ckDevs = append(ckDevs, d.Device)
		i := slices.Index(devs, d.Device)
		if i < 0 || d.Pool != node || d.UUID != uuids[i] || !slices.Equal(d.CDIDeviceIDs, []string{cdiKind + "=" + uid + "-" + d.Device}) {
			t.Errorf("checkpoint device of claim %s: %+v; allocated %v with UUIDs %v", uid, d, devs, uuids)
		}
	}
	if sortByIndex(ckDevs); !slices.Equal(ckDevs, devs) {
		t.Errorf("checkpoint lists devices %v for claim %s, want %v", ckDevs, uid, devs)
	}
	return prepared{pod: pod, claim: claim, devices: devs, uuids: uuids, specPath: path}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func mapsKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ---- nodes ----

// setNodeLabel sets (or, with value "", removes) a label of a node.
func setNodeLabel(t *testing.T, node, key, value string) {
	t.Helper()
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Patch(framework.Ctx(t), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("label node %s %s=%s: %v", node, key, value, err)
	}
}
