package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestExplainUnmanagedPods: `kubectl gputopo explain` says why a pod that
// gputopo does not hold waits: a ResourceClaimTemplate that does not
// exist (named, from the resource claim controller's event), and a claim
// whose selector names an attribute no device has.
func TestExplainUnmanagedPods(t *testing.T) {
	n := node(t, "dgx-h100", false).Name
	dumpOnFailure(t, n)
	tmpl := templates["gpu-1"].DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Name: "gpu-1-misspelt", Namespace: namespace}
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
		Expression: `device.attributes["gpu.gputopo.dev"].nvlinkDomian == "x"`}}}
	if _, err := client.ResourceV1().ResourceClaimTemplates(namespace).Create(framework.Ctx(t), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceClaimTemplates(namespace).Delete(framework.Ctx(t), tmpl.Name, metav1.DeleteOptions{})
	})

	pod := func(name, template string) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "gputopo-e2e"}},
			Spec: corev1.PodSpec{
				NodeSelector:                  map[string]string{"kubernetes.io/hostname": n},
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(template)}},
			},
		}
		if _, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		t.Cleanup(func() { deletePod(t, name) })
	}
	pod("explain-no-template", "gpu-none")
	pod("explain-misspelt", tmpl.Name)

	for name, want := range map[string]string{
		"explain-no-template": `ResourceClaimTemplate ` + namespace + `/gpu-none, which the pod's claim "gpus" names, does not exist`,
		"explain-misspelt":    "its selector names the attribute gpu.gputopo.dev/nvlinkDomian, which no device has",
	} {
		var last string
		framework.Eventually(t, waitLong, "explain to say why "+name+" waits", func() (bool, string) {
			out, err := kubectlGputopo(t, "--kubeconfig="+lc.Kubeconfig(), "explain", "pod/"+name, "-n", namespace, "-o", "json")
			if err != nil {
				return false, err.Error() + ": " + string(out)
			}
			var e struct {
				Pods []struct {
					State    string
					Problems []string
				}
			}
			if err := json.Unmarshal(out, &e); err != nil {
				t.Fatalf("explain -o json: %v\n%s", err, out)
			}
			last = string(out)
			if len(e.Pods) != 1 || e.Pods[0].State != "pending" {
				return false, last
			}
			return strings.Contains(strings.Join(e.Pods[0].Problems, "\n"), want), last
		})
		out, _ := kubectlGputopo(t, "--kubeconfig="+lc.Kubeconfig(), "explain", "pod/"+name, "-n", namespace)
		t.Logf("kubectl gputopo explain pod/%s:\n%s", name, out)
	}
}
