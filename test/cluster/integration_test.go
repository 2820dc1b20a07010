package cluster_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

// TestCluster starts 1 real + 1 fake node with the stub plugin. It needs the
// binaries of `localcluster build` in $GPUTOPO_K8S_BIN (`make e2e` sets it).
func TestCluster(t *testing.T) {
	binDir := needClusterBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	stub := filepath.Join(t.TempDir(), "stub-kubelet-plugin")
	if out, err := exec.Command("go", "build", "-o", stub, "./cmd/stub-kubelet-plugin").CombinedOutput(); err != nil {
		t.Fatalf("build stub plugin: %v\n%s", err, out)
	}
	const realNode, fakeNode = "gpu-s0-l0-n0", "gpu-s0-l0-n1"
	nodes, err := cluster.ParseTopology([]byte(`{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 2, profiles: [dgx-h100, dgx1-v100], realNodes: 1}`))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Config{Dir: t.TempDir(), BinDir: binDir, Nodes: nodes, PluginBin: stub, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() { // the directory goes with the test: keep what explains it
			for _, p := range []string{"kubelet-" + realNode, "plugin-" + realNode, "kube-scheduler"} {
				if data, err := os.ReadFile(c.LogPath(p)); err == nil {
					t.Logf("--- %s (last 4 KiB) ---\n%s", p, data[max(0, len(data)-4096):])
				}
			}
		}
	})
	t.Logf("cluster ready in %s", time.Since(start))
	client := c.Client()

	for _, name := range []string{realNode, fakeNode} {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels[cluster.LabelLeaf] != "leaf-0" || n.Labels[cluster.LabelSpine] != "spine-0" || n.Labels[cluster.LabelProfile] == "" {
			t.Errorf("node %s labels: %v", name, n.Labels)
		}
	}
	createDRAObjects(ctx, t, client)

	waitRunning(ctx, t, client, createPod(ctx, t, client, realNode, "p-real"))
	recs, err := c.ContainerRecords(realNode)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(recs, func(r cluster.Record) bool { return r.PodName == "p-real" && r.Container == "c" })
	if i < 0 {
		t.Fatalf("fake CRI did not record p-real: %+v", recs)
	}
	if len(recs[i].CDIDevices) != 2 {
		t.Errorf("p-real's container got CDI devices %v, want 2", recs[i].CDIDevices)
	}
	_, ckptDir := c.PluginDirs(realNode)
	if _, err := os.Stat(filepath.Join(ckptDir, "checkpoint.json")); err != nil {
		t.Errorf("plugin checkpoint: %v", err)
	}

	// A pod on the fake node is scheduled with its claim allocated; nothing runs it.
	fake := createPod(ctx, t, client, fakeNode, "p-fake")
	waitFor(ctx, t, "p-fake to be bound", func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, fake, metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == fakeNode
	})
	if _, err := c.ContainerRecords(fakeNode); err == nil {
		t.Error("ContainerRecords of a fake node should fail")
	}

	// A crashed plugin is restarted and serves new pods.
	if err := c.KillPlugin(realNode); err != nil {
		t.Fatal(err)
	}
	if err := c.KillPlugin(realNode); !errors.Is(err, cluster.ErrNotRunning) {
		t.Errorf("second KillPlugin: %v, want ErrNotRunning", err)
	}
	if err := c.StartPlugin(realNode); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartPlugin(realNode); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, client, createPod(ctx, t, client, realNode, "p-after-restart"))

	// An attached Cluster sees the same records.
	a, err := cluster.Attach(c.Dir())
	if err != nil {
		t.Fatal(err)
	}
	arecs, err := a.ContainerRecords(realNode)
	if err != nil || len(arecs) < 2 {
		t.Errorf("attached ContainerRecords = %d records, %v", len(arecs), err)
	}

	c.Stop()
	info := c.Nodes()
	if len(info) != 2 {
		t.Errorf("Nodes() = %+v", info)
	}
	if pid := cluster.RunningPID(c.Dir()); pid != 0 {
		t.Errorf("cluster still running as pid %d after Stop", pid)
	}
	if files, _ := filepath.Glob(filepath.Join(c.Dir(), "run", "*.pid")); len(files) > 0 {
		t.Errorf("pid files left after Stop: %v", files)
	}
}

func createDRAObjects(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	t.Helper()
	_, err := client.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: cluster.DriverName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + cluster.DriverName + `"`},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "two-gpus"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: cluster.DriverName, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
			}}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// createPod creates a pod pinned to node that uses two GPUs.
func createPod(ctx context.Context, t *testing.T, client kubernetes.Interface, node, name string) string {
	t.Helper()
	tmpl := "two-gpus"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			// What a containerd node needs; the fake CRI takes it too (it "pulls"
			// any image, so IfNotPresent, not Never).
			Tolerations: []corev1.Toleration{{Key: cluster.TaintRuntime, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{Name: "c", Image: cluster.ImageBusybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:   []string{"sleep", "inf"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "g"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "g", ResourceClaimTemplateName: &tmpl}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

func waitRunning(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	waitFor(ctx, t, name+" to be Running", func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("wait for %s: %v", what, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
