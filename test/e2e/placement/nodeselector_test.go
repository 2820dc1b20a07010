package placement

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/nodepin"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// claimPod is a pod gputopo does not manage with one claim from template
// tmpl, and nodeSelector.
func claimPod(name, tmpl string, nodeSelector map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeSelector:   nodeSelector,
			ResourceClaims: []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: ptr.To(tmpl)}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claimName}}}}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
}

// A claim template that picks a leaf or spine by CEL gives every new pod
// that uses it the node selector on that tier's label, whether gputopo
// manages the pod or not, so kube-scheduler filters nodes by label before
// it evaluates the CEL: the controller keeps the namespace's ConfigMap,
// and the gputopo-claim-node-selector admission policy adds the selector.
// The claim stays as written; a pod's own selector on that label is kept;
// a count-only claim adds nothing; deleting the template removes its entry.
func TestClaimCELLeafBecomesANodeSelector(t *testing.T) {
	ctx := framework.Ctx(t)
	cms := client.CoreV1().ConfigMaps(namespace)
	entry := func(key string) (string, bool) {
		cm, err := cms.Get(ctx, nodepin.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return "", false
		}
		v, ok := cm.Data[key]
		return v, ok
	}
	// demo/specs' gpu-4-leaf selects leaf-0's GPUs by CEL.
	framework.Eventually(t, waitStatus, "the controller's entry for gpu-4-leaf", func() (bool, string) {
		v, _ := entry(nodepin.TemplateKeyPrefix + "gpu-4-leaf")
		return v == cluster.LabelLeaf+"=leaf-0", fmt.Sprintf("entry %q", v)
	})
	spineTmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1-spine-1", Namespace: namespace},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.gputopo.dev", Count: 1,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.gputopo.dev"].spine == "spine-1"`}}}}}}}}}}
	if _, err := client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, spineTmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceClaimTemplates(namespace).Delete(context.Background(), spineTmpl.Name, metav1.DeleteOptions{})
	})
	framework.Eventually(t, waitStatus, "the controller's entry for gpu-1-spine-1", func() (bool, string) {
		v, _ := entry(nodepin.TemplateKeyPrefix + spineTmpl.Name)
		return v == cluster.LabelSpine+"=spine-1", fmt.Sprintf("entry %q", v)
	})
	// The API server reads the parameters through an informer: dry runs
	// until the policy acts on the newest entry.
	framework.Eventually(t, waitStatus, "the admission policy to read the entries", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Create(ctx, claimPod("probe", spineTmpl.Name, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeSelector[cluster.LabelSpine] == "spine-1", fmt.Sprintf("nodeSelector %v", p.Spec.NodeSelector)
	})

	for _, tc := range []struct {
		pod  *corev1.Pod
		want map[string]string
	}{
		{claimPod("sel-leaf", "gpu-4-leaf", nil), map[string]string{cluster.LabelLeaf: "leaf-0"}},
		{claimPod("sel-spine", spineTmpl.Name, map[string]string{"kubernetes.io/os": "linux"}),
			map[string]string{"kubernetes.io/os": "linux", cluster.LabelSpine: "spine-1"}},
		// The pod's own value is kept (it can then never run, which the
		// scheduler says).
		{claimPod("sel-own", "gpu-4-leaf", map[string]string{cluster.LabelLeaf: "leaf-1"}), map[string]string{cluster.LabelLeaf: "leaf-1"}},
		{claimPod("sel-count", "gpu-1", nil), nil},
	} {
		p, err := client.CoreV1().Pods(namespace).Create(ctx, tc.pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		name := p.Name
		t.Cleanup(func() { forceDeletePod(t, name) })
		if fmt.Sprint(p.Spec.NodeSelector) != fmt.Sprint(tc.want) {
			t.Errorf("pod %s was created with nodeSelector %v, want %v", name, p.Spec.NodeSelector, tc.want)
		}
	}

	// The selector holds: the pods bind inside the tier their claim asks
	// for, and their claims are the templates' as written.
	for pod, want := range map[string]func(node string) bool{
		"sel-leaf":  func(n string) bool { return topo.leafOf[n] == "leaf-0" },
		"sel-spine": func(n string) bool { return topo.spineOf[topo.leafOf[n]] == "spine-1" },
	} {
		framework.Eventually(t, waitPlaced, "pod "+pod+" bound", func() (bool, string) {
			p, err := client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return p.Spec.NodeName != "", framework.PodState(p)
		})
		p, _ := client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if !want(p.Spec.NodeName) {
			t.Errorf("pod %s bound to %s, outside the tier its claim selects", pod, p.Spec.NodeName)
		}
		c, err := framework.PodClaim(ctx, client, p, claimName)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Spec.Devices.Requests[0].Exactly.Selectors; len(got) != 1 {
			t.Errorf("claim of %s has selectors %v: the template's one CEL selector, unchanged, expected", pod, got)
		}
	}

	if err := client.ResourceV1().ResourceClaimTemplates(namespace).Delete(ctx, spineTmpl.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, waitStatus, "the deleted template's entry removed", func() (bool, string) {
		v, ok := entry(nodepin.TemplateKeyPrefix + spineTmpl.Name)
		return !ok, fmt.Sprintf("entry %q", v)
	})
	if _, err := cms.Get(ctx, nodepin.ConfigMapName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Errorf("the ConfigMap went with the spine template, but gpu-4-leaf still pins leaf-0")
	}
}
