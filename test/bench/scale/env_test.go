package scale

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

func TestBuildSlicesAsThePluginPublishes(t *testing.T) {
	nodes, err := cluster.Topology{Spines: 1, LeavesPerSpine: 2, NodesPerLeaf: 1, Profiles: []string{"dgx-h100", "dgx1-v100"}}.Expand()
	if err != nil {
		t.Fatal(err)
	}
	objs, gpus, err := BuildSlices(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if gpus != 16 || len(objs) != 2 {
		t.Fatalf("BuildSlices = %d slices, %d GPUs; want 2 slices of 8 GPUs", len(objs), gpus)
	}
	type sliceInfo struct{ Name, Node, Leaf, Spine, Block4 string }
	var got []sliceInfo
	for _, s := range objs {
		a := s.Spec.Devices[0].Attributes
		got = append(got, sliceInfo{s.Name, *s.Spec.NodeName, *a[topology.AttrLeaf].StringValue, *a[topology.AttrSpine].StringValue, *a[resourcev1.QualifiedName(topology.BlockAttr(4))].StringValue})
	}
	want := []sliceInfo{
		{"gpu-s0-l0-n0-gpu.gputopo.dev-0", "gpu-s0-l0-n0", "leaf-0", "spine-0", "gpu-s0-l0-n0-b4-0"},
		{"gpu-s0-l1-n0-gpu.gputopo.dev-0", "gpu-s0-l1-n0", "leaf-1", "spine-0", "gpu-s0-l1-n0-b4-0"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("slices (-want +got):\n%s", diff)
	}

	nodes[1].Profile = "no-such-gpu"
	if _, _, err := BuildSlices(nodes); err == nil || !strings.Contains(err.Error(), "no-such-gpu") || !strings.Contains(err.Error(), "dgx-h100") {
		t.Errorf("BuildSlices(unknown profile) = %v, want an error naming it and the built-in profiles", err)
	}
}

func TestControlPlaneArgs(t *testing.T) {
	dir := t.TempDir()
	got, err := controlPlaneArgs(dir, Limits{MaxRequestsInflight: 800, ComponentQPS: 300, ClientQPS: 1}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"kube-apiserver": {"--max-requests-inflight=800", "--max-mutating-requests-inflight=400",
			"--audit-policy-file=" + filepath.Join(dir, "audit-policy.yaml"), "--audit-log-path=" + filepath.Join(dir, "audit.log"),
			"--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-maxsize=100000"},
		"kube-scheduler":          {"--kube-api-qps=300", "--kube-api-burst=300"},
		"kube-controller-manager": {"--kube-api-qps=300", "--kube-api-burst=300"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("controlPlaneArgs (-want +got):\n%s", diff)
	}
	if policy, err := os.ReadFile(filepath.Join(dir, "audit-policy.yaml")); err != nil || string(policy) != auditPolicy {
		t.Errorf("audit policy file = %q, %v", policy, err)
	}
	if _, err := controlPlaneArgs(dir, Limits{MaxRequestsInflight: 1, ComponentQPS: 1, ClientQPS: 1}, false); err == nil {
		t.Error("controlPlaneArgs accepted --max-requests-inflight=1, which leaves no mutating requests")
	}
}

func TestParallelStopsAtTheFirstError(t *testing.T) {
	var ran atomic.Int32
	boom := errors.New("boom")
	err := parallel(context.Background(), 1000, 4, func(_ context.Context, i int) error {
		ran.Add(1)
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("parallel = %v, want the worker's error", err)
	}
	if n := ran.Load(); n >= 1000 {
		t.Errorf("parallel ran all %d items after an error, want it to stop feeding", n)
	}
	ran.Store(0)
	if err := parallel(context.Background(), 100, 4, func(context.Context, int) error { ran.Add(1); return nil }); err != nil || ran.Load() != 100 {
		t.Errorf("parallel without errors = %v after %d items, want nil after 100", err, ran.Load())
	}
}
