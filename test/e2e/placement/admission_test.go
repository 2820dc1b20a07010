package placement

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// waitRBAC bounds how long a new RoleBinding takes to be in force.
const waitRBAC = 30 * time.Second

// TestControllerAnnotationsRefused: the gputopo-placement admission policy
// refuses to create a pod, a Job, a ResourceClaim or a ResourceClaimTemplate
// that carries an annotation the controller writes, and refuses a user who
// sets, changes or removes one on an existing pod, each time naming the
// annotation; an identity holding the controller's permission may write
// them.
func TestControllerAnnotationsRefused(t *testing.T) {
	refused := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		refusedBy(t, "gputopo-placement", apierrors.IsForbidden, what, err, want)
	}

	t.Run("create", func(t *testing.T) {
		ctx := framework.Ctx(t)
		for _, key := range placementapi.ControllerAnnotations {
			pod := heldPod("set-"+strings.TrimPrefix(key, placementapi.Prefix), map[string]string{key: "x"})
			_, err := client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
			if err == nil {
				deletePodNow(t, pod.Name)
			}
			refused(t, "a pod with "+key, err, key+" is written by the gputopo controller: remove it from the pod")
		}
		two := map[string]string{placementapi.AnnotationNode: "gpu-1", placementapi.AnnotationDomain: "leaf:leaf-0"}
		pod := heldPod("set-two", two)
		_, err := client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			deletePodNow(t, pod.Name)
		}
		refused(t, "a pod with two controller annotations", err,
			placementapi.AnnotationDomain+", "+placementapi.AnnotationNode+" are written by the gputopo controller: remove them from the pod")

		job := newJob("set-domain", 2, "gpu-8-node", map[string]string{
			placementapi.AnnotationPlacement: string(placementapi.PlacementAuto), placementapi.AnnotationDomain: "leaf:leaf-0"})
		_, err = client.BatchV1().Jobs(namespace).Create(ctx, job, metav1.CreateOptions{})
		if err == nil {
			deleteJob(t, job.Name)
		}
		refused(t, "a Job whose pod template has "+placementapi.AnnotationDomain, err,
			placementapi.AnnotationDomain+" is written by the gputopo controller: remove it from the Job's pod template")

		claim := &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "set-allocated-by", Namespace: namespace,
				Annotations: map[string]string{placementapi.AnnotationAllocatedBy: namespace + "/job/train"}},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
				Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.gputopo.dev"}}}}},
		}
		_, err = client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
		if err == nil {
			_ = client.ResourceV1().ResourceClaims(namespace).Delete(ctx, claim.Name, metav1.DeleteOptions{})
		}
		refused(t, "a ResourceClaim with "+placementapi.AnnotationAllocatedBy, err,
			placementapi.AnnotationAllocatedBy+" is written by the gputopo controller: remove it from the ResourceClaim")

		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "set-allocated-by", Namespace: namespace},
			Spec: resourcev1.ResourceClaimTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{placementapi.AnnotationAllocatedBy: namespace + "/job/train"}},
				Spec:       claim.Spec,
			},
		}
		_, err = client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, tmpl, metav1.CreateOptions{})
		if err == nil {
			_ = client.ResourceV1().ResourceClaimTemplates(namespace).Delete(ctx, tmpl.Name, metav1.DeleteOptions{})
		}
		refused(t, "a ResourceClaimTemplate whose claims get "+placementapi.AnnotationAllocatedBy, err,
			placementapi.AnnotationAllocatedBy+" is written by the gputopo controller: remove it from the ResourceClaimTemplate")
	})

	t.Run("update", func(t *testing.T) {
		// A pod the controller leaves alone (it does not opt in) and the
		// scheduler never sees (its own gate).
		pod := heldPod("held", nil)
		if _, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deletePodNow(t, pod.Name) })
		user := impersonate(t, "e2e-user", false)
		writer := impersonate(t, "e2e-controller", true)
		status := placementapi.Status{Reason: placementapi.StatusUnschedulable, Message: "set by an e2e test"}.Format()

		// RBAC lets the user annotate the pod; the policy lets any key but
		// the controller's through.
		framework.Eventually(t, waitRBAC, "e2e-user to be allowed to patch pods", func() (bool, string) {
			err := annotate(t, user, pod.Name, "example.com/note", ptr.To("hello"))
			return err == nil, fmt.Sprint(err)
		})
		err := annotate(t, user, pod.Name, placementapi.AnnotationStatus, ptr.To(status))
		refused(t, "e2e-user setting "+placementapi.AnnotationStatus, err,
			placementapi.AnnotationStatus+" is written by the gputopo controller: only the controller may set, change or remove it")

		// An identity with the controller's permission writes it.
		framework.Eventually(t, waitRBAC, "e2e-controller to write "+placementapi.AnnotationStatus, func() (bool, string) {
			err := annotate(t, writer, pod.Name, placementapi.AnnotationStatus, ptr.To(status))
			return err == nil, fmt.Sprint(err)
		})
		// And the user can neither change nor remove it.
		err = annotate(t, user, pod.Name, placementapi.AnnotationStatus, ptr.To("WaitingForPods: changed"))
		refused(t, "e2e-user changing "+placementapi.AnnotationStatus, err, placementapi.AnnotationStatus+" is written by the gputopo controller")
		err = annotate(t, user, pod.Name, placementapi.AnnotationStatus, nil)
		refused(t, "e2e-user removing "+placementapi.AnnotationStatus, err, placementapi.AnnotationStatus+" is written by the gputopo controller")
		got, err := client.CoreV1().Pods(namespace).Get(framework.Ctx(t), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v := got.Annotations[placementapi.AnnotationStatus]; v != status {
			t.Errorf("%s = %q after the refused changes, want %q", placementapi.AnnotationStatus, v, status)
		}
		// Other updates of the pod still pass while it carries the key.
		if err := annotate(t, user, pod.Name, "example.com/note", ptr.To("again")); err != nil {
			t.Errorf("e2e-user changing another annotation of a pod that has %s: %v", placementapi.AnnotationStatus, err)
		}
		// The suite's controller runs with the admin credentials.
		if err := annotate(t, client, pod.Name, placementapi.AnnotationStatus, nil); err != nil {
			t.Errorf("admin removing %s: %v", placementapi.AnnotationStatus, err)
		}
	})
}

// heldPod is a pod that asks for no placement and waits at a gate of its
// own, so neither the controller nor the scheduler acts on it.
func heldPod(name string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: ann},
		Spec: corev1.PodSpec{
			SchedulingGates:               []corev1.PodSchedulingGate{{Name: "e2e.gputopo.dev/hold"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
}

func deletePodNow(t *testing.T, name string) {
	t.Helper()
	err := client.CoreV1().Pods(namespace).Delete(framework.Ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", name, err)
	}
}

// annotate sets (value non-nil) or removes one annotation of a pod.
func annotate(t *testing.T, c kubernetes.Interface, pod, key string, value *string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}})
	if err != nil {
		return err
	}
	_, err = c.CoreV1().Pods(namespace).Patch(framework.Ctx(t), pod, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// impersonate returns a client that acts as user, who may edit the
// suite's namespace (the "edit" ClusterRole) and, with controllerPermission,
// holds the controller's permission the chart grants its ServiceAccount.
// The bindings go when the test ends.
func impersonate(t *testing.T, user string, controllerPermission bool) kubernetes.Interface {
	t.Helper()
	ctx := framework.Ctx(t)
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-edit", Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   subject,
	}
	if _, err := client.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().RoleBindings(namespace).Delete(framework.Ctx(t), rb.Name, metav1.DeleteOptions{})
	})
	if controllerPermission {
		name := "gputopo-e2e-" + user
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{placementapi.ControllerPermissionGroup},
				Resources: []string{placementapi.ControllerPermissionResource}, Verbs: []string{placementapi.ControllerPermissionVerb}}},
		}
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   subject,
		}
		if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.RbacV1().ClusterRoles().Delete(framework.Ctx(t), name, metav1.DeleteOptions{}) })
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.RbacV1().ClusterRoleBindings().Delete(framework.Ctx(t), name, metav1.DeleteOptions{})
		})
	}
	cfg := lc.RESTConfig()
	cfg.Impersonate.UserName = user
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConfigRefused: the gputopo-config admission policy refuses a node
// label gputopo.dev/shared-gpus that is not all, none or GPU indexes, and a
// gputopo-label-mapping ConfigMap with an unknown key or a value that is
// not label keys, each time saying what is wrong; well-formed values pass.
func TestConfigRefused(t *testing.T) {
	refused := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		refusedBy(t, "gputopo-config", apierrors.IsInvalid, what, err, want)
		t.Logf("refused: %v", err)
	}

	t.Run("node label", func(t *testing.T) {
		ctx := framework.Ctx(t)
		var node string
		for _, n := range topo.leafNodes[topo.leaves[len(topo.leaves)-1]] {
			if !topo.real[n] {
				node = n
			}
		}
		if node == "" {
			t.Fatal("no node without a kubelet in the last leaf")
		}
		label := func(v *string) error {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{gputopology.LabelSharedGPUs: v}}})
			_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		}
		t.Cleanup(func() { _ = label(nil) })
		refused(t, "shared-gpus=half", label(ptr.To("half")),
			gputopology.LabelSharedGPUs+`: "half" is not all, none or GPU indexes joined by underscores like 0_1_4`)
		refused(t, "shared-gpus=1__2", label(ptr.To("1__2")), `"1__2" is not all, none`)
		for _, ok := range []string{"0_1", "all", "none", "7"} {
			if err := label(ptr.To(ok)); err != nil {
				t.Errorf("shared-gpus=%s: %v", ok, err)
			}
		}
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Labels[gputopology.LabelSharedGPUs]; got != "7" {
			t.Errorf("node %s has shared-gpus %q after the refused and the accepted patches, want 7", node, got)
		}
	})

	t.Run("label mapping", func(t *testing.T) {
		ctx := framework.Ctx(t)
		create := func(data map[string]string) error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: gputopology.LabelMappingConfigMap}, Data: data}
			_, err := client.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
			return err
		}
		refused(t, "a mapping with key rack", create(map[string]string{"leaf": "example.com/leaf", "rack": "example.com/rack"}),
			`gputopo-label-mapping: unknown key "rack": want leaf, spine, core, clique or tierPrefix`)
		refused(t, "a mapping whose spine is not a label key", create(map[string]string{"spine": "example.com/row, not a label"}),
			`gputopo-label-mapping: spine: "example.com/row, not a label" must be node label keys separated by commas`)
		refused(t, "a mapping with a bad tier prefix", create(map[string]string{"tierPrefix": "bad prefix/"}),
			`gputopo-label-mapping: tierPrefix "bad prefix/" must make label keys`)
		good := map[string]string{"leaf": "example.com/rack, fabric.topograph.run/tier-0", "clique": "", "tierPrefix": "example.com/tier-"}
		if err := create(good); err != nil {
			t.Fatalf("a well-formed mapping %v: %v", good, err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().ConfigMaps(namespace).Delete(context.Background(), gputopology.LabelMappingConfigMap, metav1.DeleteOptions{})
		})
		patch := []byte(`{"data":{"core":"Not_A/Key/At-All"}}`)
		_, err := client.CoreV1().ConfigMaps(namespace).Patch(ctx, gputopology.LabelMappingConfigMap, types.MergePatchType, patch, metav1.PatchOptions{})
		refused(t, "an edit that breaks the mapping", err, `core: "Not_A/Key/At-All" must be node label keys separated by commas, like fabric.topograph.run/tier-0`)
	})
}

// refusedBy fails t unless err is policy's refusal of what: the reason
// isReason tests, the policy's name and the message want.
func refusedBy(t *testing.T, policy string, isReason func(error) bool, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s was admitted", what)
		return
	}
	if !isReason(err) || !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s failed with %v (reason %s); want the %s policy's %q", what, err, apierrors.ReasonForError(err), policy, want)
	}
}

// TestGatedPodIsCreatedWithItsNote: the scheduling-gate policy writes on
// every pod it gates what the pod waits for, the note the controller
// would write (placement.AdmittedStatus), which the validation policy lets
// through; a pod created with a note of its own is refused, not
// overwritten.
func TestGatedPodIsCreatedWithItsNote(t *testing.T) {
	ctx := framework.Ctx(t)
	opted := map[string]string{placementapi.AnnotationPlacement: string(placementapi.PlacementAuto)}
	pod, err := client.CoreV1().Pods(namespace).Create(ctx, heldPod("note", opted), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create an opted-in pod: %v", err)
	}
	defer deletePodNow(t, pod.Name)
	if got := pod.Annotations[placementapi.AnnotationStatus]; got != placementapi.AdmittedStatus {
		t.Errorf("new pod's %s = %q, want %q", placementapi.AnnotationStatus, got, placementapi.AdmittedStatus)
	}
	if !slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == placementapi.SchedulingGate }) {
		t.Errorf("new pod's gates %v lack %s", pod.Spec.SchedulingGates, placementapi.SchedulingGate)
	}
	own := maps.Clone(opted)
	own[placementapi.AnnotationStatus] = "Unschedulable: made up"
	bad := heldPod("note-own", own)
	if _, err := client.CoreV1().Pods(namespace).Create(ctx, bad, metav1.CreateOptions{}); err == nil {
		deletePodNow(t, bad.Name)
		t.Errorf("a pod created with %s=%q was admitted", placementapi.AnnotationStatus, own[placementapi.AnnotationStatus])
	} else if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), placementapi.AnnotationStatus+" is written by the gputopo controller") {
		t.Errorf("a pod created with its own %s: %v, want Forbidden naming it", placementapi.AnnotationStatus, err)
	}
}
