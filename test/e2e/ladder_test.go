package e2e

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestLadderTakesBestRungAvailable: the same 4-GPU ladder claim
// (demo/specs/claims/gpu-4-ladder.yaml) gets an NVLink quad on an
// NVSwitch node and, on a node of bridged pairs, falls back to four GPUs
// on one NUMA node and runs, where the plain NVLink-quad claim waits.
// `kubectl gputopo explain` names the rung each pod got.
func TestLadderTakesBestRungAvailable(t *testing.T) {
	nvswitch := node(t, "dgx-h100", true).Name
	pairs := node(t, "hgx-pcie-pairs", true).Name
	dumpOnFailure(t, nvswitch, pairs)
	pods := map[string]string{"ladder-nvswitch": nvswitch, "ladder-pairs": pairs}
	for name, n := range pods {
		createPod(t, name, n, "gpu-4-ladder")
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"ladder-e2e"}}}`, placement.AnnotationGroup)
		if _, err := client.CoreV1().Pods(namespace).Patch(framework.Ctx(t), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createPod(t, "quad-pairs", pairs, "gpu-4-nvlink")

	want := map[string]string{"ladder-nvswitch": "gpus/nvlink", "ladder-pairs": "gpus/numa"}
	got := map[string]string{}
	for name, n := range pods {
		p := verifyPrepared(t, name, n)
		for _, r := range p.claim.Status.Allocation.Devices.Results {
			if got[name] != "" && got[name] != r.Request {
				t.Errorf("%s: results of two rungs: %s and %s", name, got[name], r.Request)
			}
			got[name] = r.Request
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rungs (-want +got):\n%s", diff)
	}
	cond, _ := waitUnschedulable(t, "quad-pairs")
	t.Logf("gpu-4-nvlink on %s waits: %s", pairs, cond)

	out, err := kubectlGputopo(t, "--kubeconfig="+lc.Kubeconfig(), "explain", "ladder-e2e", "-n", namespace, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl gputopo explain: %v\n%s", err, out)
	}
	var e struct {
		Pods []struct {
			Name   string
			Claims []struct {
				Rung             string
				RungIndex, Rungs int
			}
		}
	}
	if err := json.Unmarshal(out, &e); err != nil {
		t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	rungs := map[string]string{}
	for _, p := range e.Pods {
		for _, c := range p.Claims {
			rungs[p.Name] = fmt.Sprintf("%s %d/%d", c.Rung, c.RungIndex, c.Rungs)
		}
	}
	if diff := cmp.Diff(map[string]string{"ladder-nvswitch": "nvlink 1/4", "ladder-pairs": "numa 3/4"}, rungs); diff != "" {
		t.Errorf("explain's rungs (-want +got):\n%s", diff)
	}
}
