package e2e

// The suite, in the order of the issue that asked for it. Each test cleans
// up what it created (pods with their claims, labels, the health file), so
// tests are independent of each other and of their order.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestSlicesPublished checks every node's ResourceSlices as the API serves
// them (the real plugin's on real nodes, --print-resource-slices' on fake
// ones), and that the API server accepts --print-resource-slices' output
// for every profile.
func TestSlicesPublished(t *testing.T) {
	for _, n := range lc.Nodes() {
		t.Run(n.Name+"/"+n.Profile, func(t *testing.T) {
			checkNodeSlices(t, n)
		})
	}
	t.Run("print-resource-slices/dry-run", func(t *testing.T) {
		for _, name := range mapsKeys(profiles) {
			t.Run(name, func(t *testing.T) { dryRunPrintedSlices(t, name) })
		}
	})
}

// TestContiguousClaims lets the real kube-scheduler allocate the contiguous
// claim templates of demo/specs on each profile and checks that only valid
// NVLink blocks are handed out, and that a claim stays unschedulable on a
// node without such a block.
func TestContiguousClaims(t *testing.T) {
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	pairs := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}

	cases := []struct {
		name, profile string
		real          bool
		template      string
		pods          int     // created one after another, all must fit
		valid         [][]int // the device index sets a claim may get
	}{
		// Cube-mesh: the two quads, never a mix such as {0,1,4,5}.
		{"gpu-4-nvlink/dgx1-v100", "dgx1-v100", true, "gpu-4-nvlink", 2, quads},
		{"gpu-4-nvlink/dgx1-v100-fake", "dgx1-v100", false, "gpu-4-nvlink", 2, quads},
		// NVSwitch: any 4 are linked, but blocks are aligned.
		{"gpu-4-nvlink/dgx-h100", "dgx-h100", true, "gpu-4-nvlink", 2, quads},
		// Bridged pairs only: each pair a bridge, all four bridges used.
		{"gpu-2-nvlink-pair/hgx-pcie-pairs", "hgx-pcie-pairs", true, "gpu-2-nvlink-pair", 4, pairs},
		{"gpu-2-nvlink-pair/hgx-pcie-pairs-fake", "hgx-pcie-pairs", false, "gpu-2-nvlink-pair", 4, pairs},
		{"gpu-4-nvlink/gb200-nvl72-tray-fake", "gb200-nvl72-tray", false, "gpu-4-nvlink", 1, [][]int{{0, 1, 2, 3}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := node(t, tc.profile, tc.real).Name
			dumpOnFailure(t, n)
			var got [][]int
			for i := range tc.pods {
				pod := fmt.Sprintf("contig-%d", i)
				createPod(t, pod, n, tc.template)
				devs := indexes(t, allocatedDevices(t, waitAllocated(t, pod, n), n))
				if !slices.ContainsFunc(tc.valid, func(v []int) bool { return slices.Equal(v, devs) }) {
					t.Errorf("%s on %s (%s) got GPUs %v; valid blocks are %v", tc.template, n, tc.profile, devs, tc.valid)
				}
				for _, other := range got {
					if slices.ContainsFunc(devs, func(d int) bool { return slices.Contains(other, d) }) {
						t.Errorf("claims overlap: %v and %v", other, devs)
					}
				}
				got = append(got, devs)
			}
			t.Logf("%s on %s: %v", tc.template, n, got)
			if tc.real {
				for i := range tc.pods {
					waitRunning(t, fmt.Sprintf("contig-%d", i))
				}
			}
		})
	}

	// Where no such block exists the pod stays Pending, and the scheduler
	// says why.
	unsatisfiable := []struct {
		name, profile string
		real          bool
		template      string
	}{
		{"gpu-4-nvlink/hgx-pcie-pairs", "hgx-pcie-pairs", true, "gpu-4-nvlink"},
		{"gpu-4-nvlink/pcie-only-fake", "pcie-only", false, "gpu-4-nvlink"},
		{"gpu-2-nvlink-pair/pcie-only-fake", "pcie-only", false, "gpu-2-nvlink-pair"},
	}
	for _, tc := range unsatisfiable {
		t.Run(tc.name+"/unschedulable", func(t *testing.T) {
			n := node(t, tc.profile, tc.real).Name
			dumpOnFailure(t, n)
			createPod(t, "contig-pending", n, tc.template)
			cond, event := waitUnschedulable(t, "contig-pending")
			t.Logf("PodScheduled: %s\nFailedScheduling event: %s", cond, event)
			for what, msg := range map[string]string{"PodScheduled condition": cond, "FailedScheduling event": event} {
				if !strings.Contains(msg, unschedulableReason) {
					t.Errorf("%s message %q does not contain %q", what, msg, unschedulableReason)
				}
			}
			// The scheduler has tried the pod and refused it (above): it is
			// not bound and its claim holds no device.
			if p := getPod(t, "contig-pending"); p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
				t.Errorf("pod after the scheduler refused it: %s", framework.PodState(p))
			}
			if c, err := podClaim(getPod(t, "contig-pending")); err != nil {
				t.Error(err)
			} else if c.Status.Allocation != nil {
				t.Errorf("claim %s of an unschedulable pod is allocated: %+v", c.Name, c.Status.Allocation.Devices.Results)
			}
		})
	}
}

// TestPrepareCDI runs a pod on each real node and checks what the plugin's
// preparation handed to the container runtime: the claim's CDI device IDs,
// a CDI spec with exactly the allocated GPUs' UUIDs, and the checkpoint.
func TestPrepareCDI(t *testing.T) {
	for _, tc := range []struct{ profile, template string }{
		{"dgx-h100", "gpu-8-node"},
		{"dgx1-v100", "gpu-4-nvlink"},
		{"hgx-pcie-pairs", "gpu-2-nvlink-pair"},
		{"hgx-pcie-pairs", "gpu-1"},
	} {
		t.Run(tc.profile+"/"+tc.template, func(t *testing.T) {
			n := node(t, tc.profile, true).Name
			dumpOnFailure(t, n)
			createPod(t, "prepare", n, tc.template)
			p := verifyPrepared(t, "prepare", n)
			want := map[string]int{"gpu-8-node": 8, "gpu-4-nvlink": 4, "gpu-2-nvlink-pair": 2, "gpu-1": 1}[tc.template]
			if len(p.devices) != want {
				t.Errorf("claim got %d devices %v, want %d", len(p.devices), p.devices, want)
			}
			t.Logf("pod %s on %s: devices %v, CDI spec %s", p.pod.Name, n, p.devices, p.specPath)
		})
	}
}

// TestUnprepare deletes a running pod and checks that the plugin removed
// the claim's CDI spec and checkpoint entry, and that the GPUs can be
// prepared again.
func TestUnprepare(t *testing.T) {
	n := node(t, "dgx1-v100", true).Name
	dumpOnFailure(t, n)
	createPod(t, "unprepare", n, "gpu-4-nvlink")
	p := verifyPrepared(t, "unprepare", n)
	uid := string(p.claim.UID)

	deletePod(t, "unprepare") // grace period 0; waits for the claim to go
	framework.Eventually(t, waitLong, "the CDI spec and checkpoint entry of claim "+uid+" to go", func() (bool, string) {
		_, err := os.Stat(p.specPath)
		if !errors.Is(err, os.ErrNotExist) {
			return false, "CDI spec " + p.specPath + " still exists"
		}
		if c, ok := loadCheckpoint(t, n).Claims[uid]; ok {
			return false, "checkpoint still lists the claim as " + string(c.State)
		}
		return true, ""
	})

	// All eight GPUs, the four just released among them, serve a new claim.
	createPod(t, "unprepare-again", n, "gpu-8-node")
	if again := verifyPrepared(t, "unprepare-again", n); len(again.devices) != 8 {
		t.Errorf("gpu-8-node got %v", again.devices)
	}
}

// TestPluginCrashRestart kills the plugin (SIGKILL) while a claim is
// prepared and starts it again: the prepared claim must survive untouched,
// the restarted plugin must republish the same devices, prepare new claims
// and unprepare the old one.
func TestPluginCrashRestart(t *testing.T) {
	n := node(t, "dgx-h100", true).Name
	dumpOnFailure(t, n)
	t.Cleanup(func() {
		// Never leave the node without its plugin.
		if err := lc.StartPlugin(n); err != nil && !strings.Contains(err.Error(), "already running") {
			t.Errorf("restart plugin of %s: %v", n, err)
		}
	})

	createPod(t, "crash-old", n, "gpu-2-nvlink-pair")
	old := verifyPrepared(t, "crash-old", n)
	oldUID := string(old.claim.UID)
	specBefore, err := os.ReadFile(old.specPath)
	if err != nil {
		t.Fatal(err)
	}
	ckBefore := loadCheckpoint(t, n).Claims[oldUID]
	slicesBefore, err := nodeSlices(framework.Ctx(t), n)
	if err != nil || len(slicesBefore) == 0 {
		t.Fatalf("slices of %s: %v, %v", n, slicesBefore, err)
	}

	if err := lc.KillPlugin(n); err != nil {
		t.Fatal(err)
	}
	// Drop the published slices while no plugin runs (as the kubelet does
	// once a plugin has been gone for a while), so that what is there after
	// the restart is what the new process published, not the old one's.
	for _, s := range slicesBefore {
		if err := client.ResourceV1().ResourceSlices().Delete(framework.Ctx(t), s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete slice %s: %v", s.Name, err)
		}
	}
	if err := lc.StartPlugin(n); err != nil {
		t.Fatal(err)
	}

	// The prepared claim is intact.
	ck := loadCheckpoint(t, n)
	if got, ok := ck.Claims[oldUID]; !ok {
		t.Errorf("checkpoint lost claim %s after the crash", oldUID)
	} else if got.State != checkpoint.PrepareCompleted || !cmp.Equal(got, ckBefore) {
		t.Errorf("checkpoint entry of claim %s changed across the crash (-before +after):\n%s", oldUID, cmp.Diff(ckBefore, got))
	}
	if spec, err := os.ReadFile(old.specPath); err != nil {
		t.Errorf("CDI spec of the prepared claim after the crash: %v", err)
	} else if !bytes.Equal(spec, specBefore) {
		t.Errorf("CDI spec %s changed across the crash:\n%s", old.specPath, cmp.Diff(string(specBefore), string(spec)))
	}
	if p := getPod(t, "crash-old"); p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("pod crash-old after the crash: %s", framework.PodState(p))
	}

	// The restarted plugin republishes the same devices.
	want := sliceContent(slicesBefore)
	framework.Eventually(t, waitLong, "the restarted plugin to republish the slices of "+n, func() (bool, string) {
		now, err := nodeSlices(context.Background(), n)
		if err != nil {
			return false, err.Error()
		}
		if len(now) == 0 {
			return false, "no slices"
		}
		if d := cmp.Diff(want, sliceContent(now), quantities); d != "" {
			return false, "slices differ (-before +after):\n" + d
		}
		return true, ""
	})

	// A new claim is prepared by the restarted plugin, beside the old one.
	createPod(t, "crash-new", n, "gpu-2-nvlink-pair")
	fresh := verifyPrepared(t, "crash-new", n)
	if slices.ContainsFunc(fresh.devices, func(d string) bool { return slices.Contains(old.devices, d) }) {
		t.Errorf("new claim got %v, overlapping the old claim's %v", fresh.devices, old.devices)
	}

	// The old claim is unprepared by the process that did not prepare it.
	deletePod(t, "crash-old")
	if _, err := os.Stat(old.specPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CDI spec %s of the deleted pod's claim: %v, want it gone", old.specPath, err)
	}
	ck = loadCheckpoint(t, n)
	if _, ok := ck.Claims[oldUID]; ok {
		t.Errorf("checkpoint still lists claim %s of the deleted pod", oldUID)
	}
	if c, ok := ck.Claims[string(fresh.claim.UID)]; !ok || c.State != checkpoint.PrepareCompleted {
		t.Errorf("checkpoint entry of the new claim after deleting the old pod: %+v (present %v)", c, ok)
	}
	if _, _, err := findCDISpec(n, string(fresh.claim.UID)); err != nil {
		t.Errorf("CDI spec of the new claim after deleting the old pod: %v", err)
	}
}

// TestRelabelLeaf moves a real node to another leaf by its
// fabric.topograph.run/tier-0 label (topograph 1.0's leaf): the plugin must republish its slices
// with the new leaf, and the scheduler must act on them (a claim for
// leaf-0's GPUs no longer fits the node, and fits again once it is back).
func TestRelabelLeaf(t *testing.T) {
	n := node(t, "dgx-h100", true).Name
	dumpOnFailure(t, n)
	nodeObj, err := client.CoreV1().Nodes().Get(framework.Ctx(t), n, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	origLeaf, spine := nodeObj.Labels[topology.LabelTopographLeaf], nodeObj.Labels[topology.LabelTopographSpine]
	if origLeaf != "leaf-0" {
		t.Fatalf("node %s is on %q; the test needs a leaf-0 node (demo/specs/claims/gpu-4-leaf.yaml asks for leaf-0)", n, origLeaf)
	}
	const moved = "leaf-e2e-moved"
	t.Cleanup(func() {
		setNodeLabel(t, n, topology.LabelTopographLeaf, origLeaf)
		waitPlacement(t, n, origLeaf, spine, "")
	})

	setNodeLabel(t, n, topology.LabelTopographLeaf, moved)
	waitPlacement(t, n, moved, spine, "")

	createPod(t, "relabel", n, "gpu-4-leaf")
	cond, _ := waitUnschedulable(t, "relabel")
	t.Logf("gpu-4-leaf on the moved node: %s", cond)

	setNodeLabel(t, n, topology.LabelTopographLeaf, origLeaf)
	waitPlacement(t, n, origLeaf, spine, "")
	p := verifyPrepared(t, "relabel", n)
	_, spec, err := findCDISpec(n, string(p.claim.UID))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := envOf(spec.ContainerEdits.Env, topology.EnvLeaf); v != origLeaf {
		t.Errorf("CDI spec: %s=%q, want %q", topology.EnvLeaf, v, origLeaf)
	}
}

// TestUnhealthyGPUTainted breaks GPU 3 of a real dgx1-v100 node through the
// simulated health file: its device must carry the unhealthy taint, the
// scheduler must keep claims off it, and healing it must clear the taint.
func TestUnhealthyGPUTainted(t *testing.T) {
	n := node(t, "dgx1-v100", true).Name
	dumpOnFailure(t, n)
	healthFile := filepath.Join(lc.NodeDir(n), "unhealthy")
	t.Cleanup(func() {
		if err := os.Remove(healthFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
		waitTaints(t, n, nil)
	})

	if err := os.WriteFile(healthFile, []byte("3 XID-79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitTaints(t, n, map[string]string{"gpu-3": "XID-79"})

	// Quad {0-3} holds the tainted GPU: the first quad claim gets {4-7},
	// the second cannot be allocated.
	createPod(t, "health-a", n, "gpu-4-nvlink")
	if got := indexes(t, allocatedDevices(t, waitAllocated(t, "health-a", n), n)); !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Errorf("gpu-4-nvlink beside an unhealthy gpu-3 got GPUs %v, want [4 5 6 7]", got)
	}
	waitRunning(t, "health-a")
	createPod(t, "health-b", n, "gpu-4-nvlink")
	cond, _ := waitUnschedulable(t, "health-b")
	t.Logf("second quad while gpu-3 is unhealthy: %s", cond)

	// Healed: the taint goes and the waiting claim gets the other quad.
	if err := os.Remove(healthFile); err != nil {
		t.Fatal(err)
	}
	waitTaints(t, n, nil)
	p := verifyPrepared(t, "health-b", n)
	if got := indexes(t, p.devices); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("gpu-4-nvlink after healing got GPUs %v, want [0 1 2 3]", got)
	}
}
