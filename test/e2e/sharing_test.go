package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestSharedGPUs publishes a real dgx-h100 node's GPUs for sharing (its
// gputopo.dev/shared-gpus label) and shows DRA consumable capacity end to
// end: four pods of gpu-share-quarter share one GPU, each container's CDI
// spec carries its own device and its share; a whole-GPU claim never gets
// a GPU that holds shares; unpreparing one share leaves the others
// untouched; a plugin restart keeps them and the freed quarter is taken
// again.
func TestSharedGPUs(t *testing.T) {
	n := node(t, "dgx-h100", true).Name
	dumpOnFailure(t, n)
	setNodeLabel(t, n, topology.LabelSharedGPUs, "all")
	t.Cleanup(func() {
		setNodeLabel(t, n, topology.LabelSharedGPUs, "")
		waitShared(t, n, false)
	})
	waitShared(t, n, true)

	// One quarter at a time: kube-scheduler 1.37 counts the capacity of a
	// claim twice for a moment, once from its informer and once as still in
	// flight until PreBind returns, so quarters created together may spill
	// onto a second GPU (docs/troubleshooting.md, "shares spread over more
	// GPUs than they need").
	quarters := []string{"share-0", "share-1", "share-2", "share-3"}
	shares := map[string]share{}
	for _, p := range quarters {
		createPod(t, p, n, "gpu-share-quarter")
		shares[p] = verifyShare(t, p, n, 250)
	}
	gpu := shares[quarters[0]].device
	for _, p := range quarters {
		if shares[p].device != gpu {
			t.Errorf("pod %s got a share of %s, want %s with the other quarters (first fit packs them)", p, shares[p].device, gpu)
		}
	}

	// Whole GPUs: never the one with shares, and not all eight.
	createPod(t, "whole-1", n, "gpu-1")
	if w := verifyPrepared(t, "whole-1", n); slices.Contains(w.devices, gpu) {
		t.Errorf("a whole-GPU claim got %v, which holds four shares", w.devices)
	}
	createPod(t, "whole-8", n, "gpu-8-node")
	if cond, _ := waitUnschedulable(t, "whole-8"); cond == "" {
		t.Error("gpu-8-node must not fit a node whose GPUs hold shares")
	}
	deletePod(t, "whole-8")

	// Unprepare one share: the others keep their checkpoint entries and
	// CDI specs byte for byte.
	before := map[string][]byte{}
	for _, p := range quarters[1:] {
		before[p] = readFile(t, shares[p].specPath)
	}
	ckBefore := loadCheckpoint(t, n)
	deletePod(t, quarters[0]) // waits until the plugin unprepared it
	checkSharesIntact(t, n, quarters[1:], shares, before, ckBefore)

	// A plugin restart keeps the shares.
	t.Cleanup(func() {
		if err := lc.StartPlugin(n); err != nil && !strings.Contains(err.Error(), "already running") {
			t.Errorf("restart plugin of %s: %v", n, err)
		}
	})
	if err := lc.KillPlugin(n); err != nil {
		t.Fatal(err)
	}
	if err := lc.StartPlugin(n); err != nil {
		t.Fatal(err)
	}
	checkSharesIntact(t, n, quarters[1:], shares, before, ckBefore)

	// The freed quarter is taken again, on the same GPU, by the restarted
	// plugin.
	createPod(t, "share-4", n, "gpu-share-quarter")
	if s := verifyShare(t, "share-4", n, 250); s.device != gpu {
		t.Errorf("the fifth quarter got %s, want the freed quarter of %s", s.device, gpu)
	}
}

// share is what verifyShare found of a pod's share.
type share struct {
	device, shareID, specPath string
}

// verifyShare checks a running pod's claim holds a share of milli
// thousandths of one GPU of node, and that its container's CDI spec and
// the checkpoint say so.
func verifyShare(t *testing.T, pod, node string, milli int64) share {
	t.Helper()
	p := verifyPrepared(t, pod, node)
	results := p.claim.Status.Allocation.Devices.Results
	if len(results) != 1 || results[0].ShareID == nil {
		t.Fatalf("claim of pod %s: results %+v, want one share", pod, results)
	}
	r := results[0]
	if got := r.ConsumedCapacity[topology.CapacityMilliGPU]; got.Cmp(*resource.NewQuantity(milli, resource.DecimalSI)) != 0 {
		t.Errorf("claim of pod %s consumes %s milliGPU, want %d", pod, got.String(), milli)
	}
	_, spec, err := findCDISpec(node, string(p.claim.UID))
	if err != nil {
		t.Fatal(err)
	}
	memory := nodeDevices(t, node)[r.Device].Capacity[topology.CapacityMemory].Value
	want := map[string]string{
		topology.EnvShareMilliGPU: strconv.FormatInt(milli, 10),
		topology.EnvShareMemory:   strconv.FormatInt(memory.Value()*milli/topology.MilliPerGPU, 10),
	}
	for k, v := range want {
		if got, _ := envOf(spec.ContainerEdits.Env, k); got != v {
			t.Errorf("CDI spec of pod %s: %s=%q, want %q", pod, k, got, v)
		}
	}
	c := loadCheckpoint(t, node).Claims[string(p.claim.UID)]
	if len(c.Devices) != 1 || c.Devices[0].ShareID != string(*r.ShareID) || c.Devices[0].Consumed[topology.CapacityMilliGPU] != strconv.FormatInt(milli, 10) {
		t.Errorf("checkpoint of claim of pod %s: %+v, want share %s of %d milliGPU", pod, c.Devices, *r.ShareID, milli)
	}
	return share{device: r.Device, shareID: string(*r.ShareID), specPath: p.specPath}
}

func checkSharesIntact(t *testing.T, node string, pods []string, shares map[string]share, specs map[string][]byte, ckBefore *checkpoint.Checkpoint) {
	t.Helper()
	ck := loadCheckpoint(t, node)
	for _, p := range pods {
		if now, err := os.ReadFile(shares[p].specPath); err != nil || !bytes.Equal(now, specs[p]) {
			t.Errorf("CDI spec of pod %s changed or went: %v", p, err)
		}
		uid := claimUID(t, p)
		if diff := cmp.Diff(ckBefore.Claims[uid], ck.Claims[uid]); diff != "" {
			t.Errorf("checkpoint entry of pod %s changed (-before +after):\n%s", p, diff)
		}
	}
}

func claimUID(t *testing.T, pod string) string {
	t.Helper()
	c, err := podClaim(getPod(t, pod))
	if err != nil {
		t.Fatal(err)
	}
	return string(c.UID)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// waitShared waits until every GPU the node publishes is shared (or none
// is): allowMultipleAllocations with milliGPU capacity.
func waitShared(t *testing.T, node string, shared bool) {
	t.Helper()
	framework.Eventually(t, waitLong, fmt.Sprintf("the GPUs of %s to be published shared=%v", node, shared), func() (bool, string) {
		s, err := nodeSlices(context.Background(), node)
		if err != nil {
			return false, err.Error()
		}
		for name, d := range devicesOf(s) {
			_, milli := d.Capacity[topology.CapacityMilliGPU]
			if isShared := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations && milli; isShared != shared {
				return false, "device " + name + " is not yet"
			}
		}
		return len(s) > 0, "no slices"
	})
}
