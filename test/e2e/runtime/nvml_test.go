package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/cdi/cditest"
	"github.com/gputopo/gputopo/pkg/gpu/nvml/nvmltest"
	"github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// nvmlReport is what the nvml backend's pod prints: its environment, its
// /dev/nvidia* device nodes (as report does), then the driver libraries,
// their links and the ldconfig cache (as driverReport does).
const nvmlReport = `env; echo @@dev; for d in /dev/nvidia*; do stat -c '%n|%F|%t:%T' "$d"; done; echo @@ls; ` +
	driverReport + `; exec sleep inf`

// TestNVMLBackendRunsAPod runs the plugin as it runs on a GPU node, with the
// nvml backend, over a driver root laid out like a real install whose
// libnvidia-ml.so.1 is the NVML stand-in (two H100s behind an NVSwitch):
// discovery goes through go-nvml's dlopen and cgo calls, the slices carry
// the GPUs NVML reports (UUIDs, NVLink domain and pairs from the switch
// lanes), kube-scheduler allocates an NVLink pair from them, and the pod's
// container, started by containerd and runc from the spec the plugin wrote
// (nvcdi's driver edits, the shipped nvidia-cdi-hook installed on the node),
// has both GPUs' device nodes, the driver libraries with the links the
// hooks made and an ldconfig cache listing libcuda, and the GPUs' UUIDs.
// When the pod goes, the claim is unprepared and its spec removed; an Xid
// that NVML's event set delivers for GPU 1 taints that device.
func TestNVMLBackendRunsAPod(t *testing.T) {
	// Under the node's directory, which containerd's mount namespace sees.
	root, err := os.MkdirTemp(lc.NodeDir(node), "nvml-driver-")
	if err != nil {
		t.Fatal(err)
	}
	eventsFile := filepath.Join(root, "nvml-event")
	standIn := nvmltest.Config{DriverVersion: cditest.DriverVersion, CUDAVersion: 12040, GPUs: nvmltest.H100s(2), EventsFile: eventsFile}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nvmltest.FakeDriver(root, standIn); err != nil {
		t.Fatal(err)
	}

	_, pluginDir := lc.PluginDirs(node)
	t.Cleanup(func() {
		// The pods' cleanups ran first (registered later): the nvml plugin
		// unprepares their claims before the simulated one comes back.
		framework.Eventually(t, 2*time.Minute, "the nvml plugin's claims unprepared", noClaimPrepared)
		if err := lc.StopPlugin(node); err != nil {
			t.Error(err)
		}
		if err := lc.StartPlugin(node); err != nil { // the simulated GPUs again
			t.Errorf("restart plugin of %s: %v", node, err)
		}
		framework.Eventually(t, time.Minute, "the simulated GPUs published again", func() (bool, string) {
			uuids := publishedUUIDs(t)
			return len(uuids) > 0 && !slices.Contains(uuids, standIn.GPUs[0].UUID), fmt.Sprintf("UUIDs %v", uuids)
		})
		os.RemoveAll(root)
	})
	framework.Eventually(t, 2*time.Minute, "earlier claims on "+node+" unprepared", noClaimPrepared)
	if err := lc.StopPlugin(node); err != nil {
		t.Fatal(err)
	}
	// The cluster starts the plugin with the simulated backend's flags;
	// these empty them and point it at the driver root.
	if err := lc.StartPluginWith(node, "--backend=nvml", "--profile=", "--sim-health-file=", "--sim-dev-root=",
		"--nvidia-driver-root="+root); err != nil {
		t.Fatal(err)
	}
	want := make([]string, len(standIn.GPUs))
	for i, g := range standIn.GPUs {
		want[i] = g.UUID
	}
	framework.Eventually(t, time.Minute, "the stand-in's GPUs published", func() (bool, string) {
		uuids := publishedUUIDs(t)
		return slices.Equal(uuids, want), fmt.Sprintf("UUIDs %v, want %v", uuids, want)
	})
	devs := sliceDevices(t)
	for name, d := range devs {
		if got := str(d, "productName"); got != standIn.GPUs[0].Name {
			t.Errorf("device %s: productName %q, want NVML's %q", name, got, standIn.GPUs[0].Name)
		}
		if str(d, "nvlinkDomain") == "" || str(d, "nvlinkBlock2") == "" {
			t.Errorf("device %s has no NVLink domain or pair though NVML reports 18 switch lanes: %v", name, d.Attributes)
		}
	}

	pod, logs := runPod(t, "nvml-pair", map[string]string{"pair": "gpu-2-nvlink-pair"}, nvmlReport)
	ctx := framework.Ctx(t)
	claim, err := framework.PodClaim(ctx, client, pod, "pair")
	if err != nil {
		t.Fatal(err)
	}
	path, spec, err := framework.FindCDISpec(lc, node, string(claim.UID))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("container output:\n%s", logs)
	installed := filepath.Join(pluginDir, cdi.HookName)
	hooks := 0
	for _, h := range spec.ContainerEdits.Hooks {
		hooks++
		if h.Path != installed {
			t.Errorf("spec %s: hook %v runs %s, want the hook the plugin installed, %s", path, h.Args, h.Path, installed)
		}
	}
	if hooks == 0 {
		t.Errorf("spec %s has no hooks: nvcdi's driver edits were not used", path)
	}

	s := parseReport(t, logs)
	if got := s.env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
		t.Errorf("container: NVIDIA_VISIBLE_DEVICES=%q, want void (the devices come from CDI)", got)
	}
	var env []string
	for k, v := range s.env {
		env = append(env, k+"="+v)
	}
	for _, uuid := range want {
		if !slices.ContainsFunc(env, func(e string) bool { return strings.Contains(e, uuid) }) {
			t.Errorf("the container's environment does not name GPU %s: %v", uuid, env)
		}
	}
	for i := range standIn.GPUs {
		p := fmt.Sprintf("/dev/nvidia%d", i)
		if got, w := s.devices[p], hostDevice(t, filepath.Join(root, "dev", fmt.Sprintf("nvidia%d", i))); got != w {
			t.Errorf("container: %s is %q, want %q as on the host", p, got, w)
		}
	}
	if _, ok := s.devices["/dev/nvidiactl"]; !ok {
		t.Errorf("container has no /dev/nvidiactl: %v", s.devices)
	}
	libs := strings.Fields(section(logs, "ls"))
	for _, lib := range []string{"libcuda.so." + cditest.DriverVersion, "libnvidia-ml.so." + cditest.DriverVersion} {
		if !slices.Contains(libs, lib) {
			t.Errorf("%s is not mounted in the container's %s: %v", lib, cditest.LibDir, libs)
		}
	}
	if links := section(logs, "links"); !strings.Contains(links, "libcuda.so.1 -> libcuda.so."+cditest.DriverVersion) {
		t.Errorf("the container has no libcuda.so.1 link: %s", links)
	}
	ldcache := strings.Split(section(logs, "ldcache"), "\n")
	if !slices.ContainsFunc(ldcache, func(l string) bool {
		n, ok := strings.CutPrefix(l, "libcuda.so.1: ")
		return ok && n != "0"
	}) {
		t.Errorf("the container's /etc/ld.so.cache does not list libcuda.so.1: %v", ldcache)
	}

	deletePod(t, pod.Name)
	framework.Eventually(t, 2*time.Minute, "claim "+claim.Name+" unprepared", func() (bool, string) {
		return framework.Unprepared(lc, node, string(claim.UID))
	})
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("spec %s of the unprepared claim: %v, want it gone", path, err)
	}

	// Health through NVML's event set: an Xid on GPU 1 taints its device.
	if err := nvmltest.InjectEvent(eventsFile, 1, 79, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "gpu-1 tainted for Xid 79", func() (bool, string) {
		var taints []string
		for name, d := range sliceDevices(t) {
			for _, taint := range d.Taints {
				taints = append(taints, name+": "+taint.Key+"="+taint.Value)
				if name == "gpu-1" && taint.Key == topology.TaintUnhealthy && taint.Value == "XID-79" {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("taints %v", taints)
	})
	if taints := sliceDevices(t)["gpu-0"].Taints; len(taints) != 0 {
		t.Errorf("gpu-0 is tainted %v though only GPU 1 had an Xid", taints)
	}
}

// publishedUUIDs is the sorted UUIDs of the devices the node publishes.
func publishedUUIDs(t *testing.T) []string {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for _, s := range list.Items {
		if s.Spec.Pool.Name != node {
			continue
		}
		for _, d := range s.Spec.Devices {
			if u := str(d, "uuid"); u != "" {
				uuids = append(uuids, u)
			}
		}
	}
	slices.Sort(uuids)
	return uuids
}
