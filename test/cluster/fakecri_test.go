package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestFakeCRIRecordsCreateContainer(t *testing.T) {
	dir := t.TempDir()
	socket, records := filepath.Join(dir, "cri.sock"), filepath.Join(dir, "containers.jsonl")
	f, err := StartFakeCRI(socket, records)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	rt, img := runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn)

	if _, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}}); err != nil {
		t.Fatal(err)
	}
	st, err := img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetImage().GetSize() == 0 {
		t.Error("image size is 0; the kubelet rejects that")
	}

	sandboxCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p1", Namespace: "ns", Uid: "uid-1"}}
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxCfg})
	if err != nil {
		t.Fatal(err)
	}
	created, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		SandboxConfig: sandboxCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata:    &runtimeapi.ContainerMetadata{Name: "c"},
			Image:       &runtimeapi.ImageSpec{Image: "busybox"},
			CDIDevices:  []*runtimeapi.CDIDevice{{Name: "gputopo.dev/gpu=a"}, {Name: "gputopo.dev/gpu=b"}},
			Annotations: map[string]string{"cdi.k8s.io/x": "gputopo.dev/gpu=a", "other": "y"},
			Envs:        []*runtimeapi.KeyValue{{Key: "K", Value: []byte("V")}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: created.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	logPath := cs.GetStatus().GetLogPath()
	if logPath == "" {
		t.Error("empty container log path; the kubelet's log cleanup would glob its working directory")
	} else if _, err := os.Stat(logPath); !os.IsNotExist(err) {
		t.Errorf("container log path %s should not exist: %v", logPath, err)
	}

	got, err := ReadRecords(records)
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{{
		PodName: "p1", PodNamespace: "ns", PodUID: "uid-1", Container: "c",
		CDIDevices:     []string{"gputopo.dev/gpu=a", "gputopo.dev/gpu=b"},
		CDIAnnotations: map[string]string{"cdi.k8s.io/x": "gputopo.dev/gpu=a"},
		Env:            map[string]string{"K": "V"},
	}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Record{}, "Time")); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

func TestReadRecordsMissingFile(t *testing.T) {
	got, err := ReadRecords(filepath.Join(t.TempDir(), "none.jsonl"))
	if err != nil || got != nil {
		t.Errorf("ReadRecords(missing) = %v, %v; want nil, nil", got, err)
	}
}

func TestParseResourceSlices(t *testing.T) {
	doc := `---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s1}
spec:
  driver: gpu.gputopo.dev
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 2}
  devices: [{name: gpu-0}]
---
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {generateName: n1-}
spec:
  driver: gpu.gputopo.dev
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 2}
  devices: [{name: gpu-1}]
`
	slices, err := ParseResourceSlices([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range slices {
		names = append(names, s.Name+s.GenerateName+"/"+s.Spec.Devices[0].Name)
	}
	if diff := cmp.Diff([]string{"s1/gpu-0", "n1-/gpu-1"}, names); diff != "" {
		t.Errorf("slices (-want +got):\n%s", diff)
	}

	_, err = ParseResourceSlices([]byte("apiVersion: v1\nkind: ConfigMap\n"))
	if err == nil || !strings.Contains(err.Error(), "want resource.k8s.io/v1 ResourceSlice") {
		t.Errorf("ConfigMap: want a kind error, got %v", err)
	}
}
