package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeBinDir holds empty files named like the Kubernetes binaries, enough
// for Validate.
func fakeBinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(dir, b.Name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestValidateExtraArgs(t *testing.T) {
	bin := fakeBinDir(t)
	ok := Config{Dir: t.TempDir(), BinDir: bin, ExtraArgs: map[string][]string{
		"kube-apiserver": {"--max-requests-inflight=800"},
		"kube-scheduler": {"--kube-api-qps=500"},
	}}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(control plane ExtraArgs) = %v, want nil", err)
	}
	bad := Config{Dir: t.TempDir(), BinDir: bin, ExtraArgs: map[string][]string{"kubelet": {"--v=4"}}}
	err := bad.Validate()
	if err == nil || !strings.Contains(err.Error(), `"kubelet"`) || !strings.Contains(err.Error(), "kube-scheduler") {
		t.Errorf("Validate(ExtraArgs for kubelet) = %v, want an error naming kubelet and the processes that take extra arguments", err)
	}
}

// NoPluginNodes must name real nodes, and Images need a containerd node
// to be imported into; both errors say what was wrong.
func TestValidateNoPluginNodesAndImages(t *testing.T) {
	bin := fakeBinDir(t)
	nodes := []NodeSpec{{Name: "real-0", Real: true, Profile: "dgx-h100"}, {Name: "fake-0", Profile: "dgx-h100"}}
	dir, err := os.MkdirTemp("/tmp", "v") // short: the node's socket paths must fit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := (Config{Dir: dir, BinDir: bin, Nodes: nodes, NoPluginNodes: []string{"real-0"}}).Validate(); err != nil {
		t.Errorf("Validate(NoPluginNodes: a real node) = %v, want nil", err)
	}
	for _, name := range []string{"fake-0", "missing"} {
		err := Config{Dir: dir, BinDir: bin, Nodes: nodes, NoPluginNodes: []string{name}}.Validate()
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "not a real node") {
			t.Errorf("Validate(NoPluginNodes: %s) = %v, want an error naming it and saying it is not a real node", name, err)
		}
	}
	img := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = Config{Dir: dir, BinDir: bin, Nodes: nodes, Images: []string{img}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "containerd") {
		t.Errorf("Validate(Images without a containerd node) = %v, want an error saying it needs one", err)
	}
	err = Config{Dir: dir, BinDir: bin, Nodes: nodes, Images: []string{img + ".missing"}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "build-image-oci") {
		t.Errorf("Validate(a missing image tarball) = %v, want an error saying how to build it", err)
	}
}

// A topology with a containerd node is refused before anything starts
// when this machine lacks what such a node needs, naming each missing
// thing and how to get it: the containerd binaries (`localcluster
// build`), runc and busybox-static (`make runtime-deps`), and root.
func TestValidateNamesMissingRuntimeDeps(t *testing.T) {
	bin := fakeBinDir(t)
	nodes := []NodeSpec{{Name: "ctr-0", Real: true, Profile: "dgx-h100", Runtime: RuntimeContainerd}}
	dir, err := os.MkdirTemp("/tmp", "v") // short: the node's socket paths must fit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("PATH", t.TempDir()) // no runc
	err = Config{Dir: dir, BinDir: bin, ContainerdBinDir: t.TempDir(), Nodes: nodes}.Validate()
	if err == nil {
		t.Fatal("Validate of a containerd node on a machine without its binaries: nil error")
	}
	for _, want := range []string{"node ctr-0 runs containerd", "containerd binaries (run `localcluster build`)", "runc:", "make runtime-deps"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to say %q", err, want)
		}
	}
	if checkStatic(BusyboxBinary) != nil && !strings.Contains(err.Error(), "busybox for the local images") {
		t.Errorf("Validate = %v, want it to name the missing static busybox", err)
	}
	if os.Geteuid() != 0 && !strings.Contains(err.Error(), "run as root") {
		t.Errorf("Validate = %v, want it to say containerd nodes need root", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused Validate left %d entries in the cluster directory", len(entries))
	}
}
