package cluster_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

const numaAttribute = resourcev1.QualifiedName("resource.kubernetes.io/numaNode")

// TestClusterNUMAList is the only cluster with the alpha gate
// DRAListTypeAttributes on, the one the plugin's --numa-node-list needs
// (every other cluster runs the version's default gates): the real plugin
// publishes resource.kubernetes.io/numaNode as a list, the API server keeps
// it, and the scheduler allocates a claim that matches GPUs on it.
func TestClusterNUMAList(t *testing.T) {
	binDir := needClusterBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	plugin, _ := productBinaries(t, t.TempDir())
	nodes, err := cluster.ParseTopology([]byte(`{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 1, profiles: [dgx-h100], realNodes: 1}`))
	if err != nil {
		t.Fatal(err)
	}
	node := nodes[0].Name
	// Short: the kubelet's unix sockets live under it.
	dir, err := os.MkdirTemp("", "gputopo-numa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	c, err := cluster.Start(ctx, cluster.Config{
		Dir: dir, BinDir: binDir, Nodes: nodes, PluginBin: plugin, Progress: testWriter{t},
		PluginArgs:   []string{"--numa-node-list"},
		FeatureGates: map[string]bool{"DRAListTypeAttributes": true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			if data, err := os.ReadFile(c.LogPath("plugin-" + node)); err == nil {
				t.Logf("--- plugin log (last 4 KiB) ---\n%s", data[max(0, len(data)-4096):])
			}
		}
	})
	client := c.Client()

	// What the API server stored: a list on every GPU.
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + node})
	if err != nil {
		t.Fatal(err)
	}
	numa := map[string][]int64{} // device → its NUMA nodes
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			a, ok := d.Attributes[numaAttribute]
			switch {
			case !ok:
				t.Errorf("device %s has no %s", d.Name, numaAttribute)
			case a.IntValue != nil || len(a.IntValues) == 0:
				t.Errorf("device %s: %s = %+v, want a list of ints", d.Name, numaAttribute, a)
			default:
				numa[d.Name] = a.IntValues
			}
		}
	}
	if len(numa) != 8 {
		t.Fatalf("%d devices of %s with %s as a list, want 8: %v", len(numa), node, numaAttribute, numa)
	}

	// Two GPUs that share a NUMA node, by matchAttribute on the list.
	createDRAObjects(ctx, t, client)
	_, err = client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "two-gpus-one-numa"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: cluster.DriverName, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
			}}},
			Constraints: []resourcev1.DeviceConstraint{{MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(numaAttribute))}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := "two-gpus-one-numa"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "numa-pair", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			Containers: []corev1.Container{{Name: "c", Image: cluster.ImageBusybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:   []string{"sleep", "inf"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "g"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "g", ResourceClaimTemplateName: &tmpl}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, client, pod.Name)
	p, err := client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s claim statuses: %+v", pod.Name, p.Status.ResourceClaimStatuses)
	}
	claim, err := client.ResourceV1().ResourceClaims("default").Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 2 {
		t.Fatalf("claim %s allocation: %+v", claim.Name, claim.Status.Allocation)
	}
	a, b := claim.Status.Allocation.Devices.Results[0].Device, claim.Status.Allocation.Devices.Results[1].Device
	if !slices.ContainsFunc(numa[a], func(n int64) bool { return slices.Contains(numa[b], n) }) {
		t.Errorf("claim %s got %s (NUMA %v) and %s (NUMA %v), which share no NUMA node", claim.Name, a, numa[a], b, numa[b])
	}
	t.Logf("%s got %s (NUMA %v) and %s (NUMA %v)", claim.Name, a, numa[a], b, numa[b])
}
