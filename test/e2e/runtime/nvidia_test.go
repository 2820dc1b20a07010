package runtime

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/cdi/cditest"
	"github.com/gputopo/gputopo/pkg/gpu/nvml/nvmltest"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// driverReport is what the NVIDIA path's container prints: the driver
// library directory, where its soname links point, and how many lines of
// the ldconfig cache name libcuda.so.1 and its path (busybox has no
// ldconfig to read the cache; grep counts it as text).
const driverReport = `lib=` + cditest.LibDir + `; ls $lib; echo @@links; ` +
	`for l in libcuda.so.1 libcuda.so libnvidia-ml.so.1; do echo "$l -> $(readlink $lib/$l)"; done; ` +
	`echo @@ldcache; ls -l /etc/ld.so.cache /etc/ld.so.conf.d; for e in libcuda.so.1 $lib/libcuda.so.1; do echo "$e: $(grep -c $e /etc/ld.so.cache)"; done; echo @@end`

// TestNVIDIADriverPathInRealContainer runs the NVIDIA driver edits that
// the plugin's nvml backend generates (nvcdi, over a fake driver root laid
// out like a real install, with real ELF libraries carrying their
// SONAMEs) through containerd and runc, with the nvidia-cdi-hook that
// `make build` builds as the specs' hook: inside the container the driver
// libraries are mounted, the hooks made the soname and development links,
// and the ldconfig cache they wrote lists libcuda.
//
// The test generates the edits with the plugin's own cdi.NewNVIDIA and a
// mock NVML, and starts the container with ctr --device on the node's
// containerd, with the soname links removed from the driver root so that
// only the hooks can make them. TestNVMLBackendRunsAPod takes the same
// path through the plugin and a pod.
func TestNVIDIADriverPathInRealContainer(t *testing.T) {
	hook, err := filepath.Abs(filepath.Join(os.Getenv("GPUTOPO_BIN"), cdi.HookName))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(hook); err != nil {
		t.Fatalf("the nvidia-cdi-hook `make build` builds: %v; run `make build`", err)
	}

	// Under the node's directory, which containerd's mount namespace sees.
	root, err := os.MkdirTemp(lc.NodeDir(node), "nvidia-driver-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	// Real ELF libraries carrying their SONAMEs, as the hooks need.
	if err := nvmltest.FakeDriver(root, nvmltest.Config{GPUs: nvmltest.H100s(1)}); err != nil {
		t.Fatal(err)
	}
	// A driver install has no soname links until ldconfig runs; the hook
	// must make them in the container.
	libDir := filepath.Join(root, cditest.LibDir)
	for _, l := range []string{"libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"} {
		if err := os.Remove(filepath.Join(libDir, l)); err != nil {
			t.Fatal(err)
		}
	}

	const uuid = "GPU-5e0b7a11-0000-4000-8000-000000000001"
	edits, err := cdi.NewNVIDIA(framework.Ctx(t), cditest.NVML(uuid), cdi.DriverRoots{Driver: root, HookPath: hook})
	if err != nil {
		t.Fatal(err)
	}
	common, err := edits.Common()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := edits.Device(uuid)
	if err != nil {
		t.Fatal(err)
	}
	spec := &cdispec.Spec{
		Kind:           cdi.Vendor + "/" + cdi.Class,
		Devices:        []cdispec.Device{{Name: "nvidia-path", ContainerEdits: *dev}},
		ContainerEdits: *common,
	}
	if spec.Version, err = cdispec.MinimumRequiredVersion(spec); err != nil {
		t.Fatal(err)
	}
	raw, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CDI spec:\n%s", raw)
	hooks := map[string]bool{}
	for _, h := range common.Hooks {
		if h.Path != hook {
			t.Errorf("spec hook %v runs %s, want the built hook %s", h.Args, h.Path, hook)
		}
		if len(h.Args) > 1 {
			hooks[h.Args[1]] = true
		}
	}
	for _, h := range []string{"create-symlinks", "update-ldcache"} {
		if !hooks[h] {
			t.Fatalf("the driver edits have no %s hook (hooks: %v)", h, hooks)
		}
	}
	wantLibcudaSo := strings.Contains(string(raw), "libcuda.so.1::"+cditest.LibDir+"/libcuda.so")

	// ctr reads specs from /etc/cdi and /var/run/cdi: give it this one
	// there in a mount namespace of its own, leaving containerd's alone.
	specDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(specDir, "nvidia-path.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	ctr := filepath.Join(cluster.DefaultContainerdBinDir(), "ctr")
	name := "gputopo-nvidia-path"
	// /run is containerd's own (tmpfs): /run/cdi is created there, empty,
	// and the spec directory bound onto it only in ctr's namespace.
	script := `mkdir -p /run/cdi && mount --bind "$1" /run/cdi && shift && exec "$@"`
	// ctr mounts the image's snapshot itself and hands the shim fifos by
	// /proc/self: it runs in containerd's mount and PID namespaces, where
	// /var/lib/containerd and /run/containerd are.
	pid, err := lc.ContainerdPID(node)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--target="+strconv.Itoa(pid), "--mount", "--pid", "--", "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", specDir,
		ctr, "--address", lc.ContainerdSocket(node), "--namespace", "k8s.io", "run", "--rm",
		"--device", cdi.Vendor+"/"+cdi.Class+"=nvidia-path", cluster.ImageBusybox, name, "sh", "-c", driverReport)
	out, err := cmd.CombinedOutput()
	t.Logf("container output:\n%s", out)
	if err != nil {
		t.Fatalf("run the container through containerd: %v", err)
	}
	sections := map[string][]string{}
	section := "ls"
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "@@") {
			section = line[2:]
			continue
		}
		if line = strings.TrimSpace(line); line != "" {
			sections[section] = append(sections[section], line)
		}
	}
	if len(sections["end"]) != 0 || !strings.Contains(string(out), "@@end") {
		t.Fatalf("the container did not finish its report")
	}
	for _, lib := range []string{"libcuda.so." + cditest.DriverVersion, "libnvidia-ml.so." + cditest.DriverVersion} {
		if !slices.Contains(sections["ls"], lib) {
			t.Errorf("%s is not mounted in the container's %s: %v", lib, cditest.LibDir, sections["ls"])
		}
	}
	wantLinks := []string{"libcuda.so.1 -> libcuda.so." + cditest.DriverVersion, "libnvidia-ml.so.1 -> libnvidia-ml.so." + cditest.DriverVersion}
	if wantLibcudaSo {
		wantLinks = append(wantLinks, "libcuda.so -> libcuda.so.1")
	}
	for _, l := range wantLinks {
		if !slices.Contains(sections["links"], l) {
			t.Errorf("link %s missing in the container: %v", l, sections["links"])
		}
	}
	for _, entry := range []string{"libcuda.so.1", cditest.LibDir + "/libcuda.so.1"} {
		if slices.Contains(sections["ldcache"], entry+": 0") || !slices.ContainsFunc(sections["ldcache"], func(l string) bool { return strings.HasPrefix(l, entry+": ") }) {
			t.Errorf("the container's /etc/ld.so.cache does not list %s: %v", entry, sections["ldcache"])
		}
	}
}
