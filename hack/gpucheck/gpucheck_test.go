package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/nvml/nvmltest"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/kubeletplugin"
	"github.com/gputopo/gputopo/pkg/slices"
)

const testNode = "gpu-node-1"

// machine is a node as the check sees it: the plugin's slices, nvidia-smi's
// outputs and a sysfs tree, all derived from one simulated profile so they
// agree unless a test makes them disagree.
type machine struct {
	dir    string
	inv    *gpu.Inventory
	matrix [][]int
	sysfs  string
}

func newMachine(t *testing.T, profile string) *machine {
	t.Helper()
	p, err := sim.LoadBuiltin(profile)
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{dir: t.TempDir(), inv: p.Inventory(testNode), matrix: p.NVLink}
	m.sysfs = filepath.Join(m.dir, "sys")
	// The profile's synthetic sysfs, on disk: the plugin (from the
	// profile) and the check (from the disk) read the same tree.
	err = fs.WalkDir(m.inv.SysFS, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(m.inv.SysFS, name)
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := fs.ReadLink(m.inv.SysFS, name)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(m.sysfs, name)), 0o755); err != nil {
				return err
			}
			return os.Symlink(target, filepath.Join(m.sysfs, name))
		}
		if err != nil {
			return err
		}
		m.write(t, filepath.Join("sys", name), string(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m.inv.SysFS = os.DirFS(m.sysfs).(fs.ReadLinkFS)
	return m
}

func (m *machine) write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(m.dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// slices is what --print-resource-slices prints for the machine.
func (m *machine) slices(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	if err := kubeletplugin.PrintResourceSlices(&b, m.inv, slices.Node{Name: testNode}, slices.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// smiQuery is nvidia-smi's CSV for the machine, in its spelling.
func (m *machine) smiQuery() string {
	var b strings.Builder
	for _, d := range m.inv.Devices {
		fmt.Fprintf(&b, "%d, %s, %s, %d, %s, %s\n", d.Index, d.UUID, "0000"+strings.ToUpper(d.PCIBusID), d.MemoryBytes>>20, zeroPad(d.DriverVersion), d.ProductName)
	}
	return b.String()
}

// zeroPad spells a driver version as NVIDIA does ("570.124.06").
func zeroPad(v string) string {
	parts := strings.Split(v, ".")
	if len(parts) == 3 && len(parts[2]) == 1 {
		parts[2] = "0" + parts[2]
	}
	return strings.Join(parts, ".")
}

func (m *machine) smiBanner() string {
	return fmt.Sprintf("| NVIDIA-SMI %s   Driver Version: %s   CUDA Version: %s  |\n", m.inv.Devices[0].DriverVersion, m.inv.Devices[0].DriverVersion, m.inv.Devices[0].CUDADriverVersion)
}

// topo renders `nvidia-smi topo -m` for the machine's NVLink matrix.
func (m *machine) topo() string {
	n := len(m.inv.Devices)
	var b strings.Builder
	b.WriteString("\t")
	for i := range n {
		fmt.Fprintf(&b, "GPU%d\t", i)
	}
	b.WriteString("NIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n")
	for i := range n {
		fmt.Fprintf(&b, "GPU%d\t", i)
		for j := range n {
			switch {
			case i == j:
				b.WriteString(" X \t")
			case m.matrix != nil && m.matrix[i][j] > 0:
				fmt.Fprintf(&b, "NV%d\t", m.matrix[i][j])
			default:
				b.WriteString("SYS\t")
			}
		}
		b.WriteString("PXB\t0-55,112-167\t0\t\tN/A\n")
	}
	b.WriteString("NIC0\tPXB\tSYS\n\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n")
	return b.String()
}

// nvlinkStatus renders `nvidia-smi nvlink --status`: each GPU's links,
// active ones with a speed.
func (m *machine) nvlinkStatus(active func(i int) int) string {
	var b strings.Builder
	for i, d := range m.inv.Devices {
		fmt.Fprintf(&b, "GPU %d: %s (UUID: %s)\n", i, d.ProductName, d.UUID)
		for l := range 18 {
			if l < active(i) {
				fmt.Fprintf(&b, "\t Link %d: 26.562 GB/s\n", l)
			} else {
				fmt.Fprintf(&b, "\t Link %d: <inactive>\n", l)
			}
		}
	}
	return b.String()
}

// check runs gpucheck facts on the machine's files.
func (m *machine) check(t *testing.T, slicesYAML, query, topo, status string) (string, error) {
	t.Helper()
	args := []string{"facts",
		"-slices", m.write(t, "slices.yaml", slicesYAML),
		"-smi-query", m.write(t, "query.csv", query),
		"-smi", m.write(t, "smi.txt", m.smiBanner()),
		"-sysfs", m.sysfs,
	}
	if topo != "" {
		args = append(args, "-topo", m.write(t, "topo.txt", topo))
	}
	if status != "" {
		args = append(args, "-nvlink-status", m.write(t, "status.txt", status))
	}
	var out strings.Builder
	err := run(args, &out)
	return out.String(), err
}

func TestAgreeingMachinesPass(t *testing.T) {
	for _, profile := range []string{"dgx-h100", "dgx1-v100", "hgx-pcie-pairs", "pcie-only", "gb200-nvl72-tray"} {
		t.Run(profile, func(t *testing.T) {
			m := newMachine(t, profile)
			status := ""
			if profile == "dgx-h100" {
				status = m.nvlinkStatus(func(int) int { return 18 })
			}
			out, err := m.check(t, m.slices(t), m.smiQuery(), m.topo(), status)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, want := range []string{"ok: gpu-0 (nvidia-smi GPU 0) bus ID", "PCIe root", "NUMA node", "memory MiB", "driver version", "CUDA version", "nvlinkBlock2"} {
				if !strings.Contains(out, want) {
					t.Errorf("report lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestDisagreementsAreMismatches(t *testing.T) {
	tests := map[string]struct {
		profile string
		break_  func(t *testing.T, m *machine, slices, query, topo *string)
		want    string
	}{
		"NUMA node": {"dgx-h100", func(t *testing.T, m *machine, _, _, _ *string) {
			dev, err := filepath.EvalSymlinks(filepath.Join(m.sysfs, "bus/pci/devices", m.inv.Devices[5].PCIBusID))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dev, "numa_node"), []byte("0\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "MISMATCH: gpu-5 (nvidia-smi GPU 5) NUMA node: published 1, the machine says 0"},
		"memory": {"dgx-h100", func(_ *testing.T, _ *machine, _, q, _ *string) {
			*q = strings.Replace(*q, ", 81920, ", ", 81559, ", 1)
		}, "MISMATCH: gpu-0 (nvidia-smi GPU 0) memory MiB: published 81920, the machine says 81559"},
		"bus ID": {"pcie-only", func(_ *testing.T, m *machine, _, q, _ *string) {
			*q = strings.Replace(*q, strings.ToUpper(m.inv.Devices[1].PCIBusID), "0000:EE:00.0", 1)
		}, "bus ID: published"},
		"GPU missing": {"dgx-h100", func(_ *testing.T, _ *machine, s, _, _ *string) {
			// The last device of the slice is dropped.
			*s = (*s)[:strings.LastIndex(*s, "  - attributes:")] + "  driver: gpu.gputopo.dev\n" + (*s)[strings.Index(*s, "  nodeName:"):]
		}, "is not published"},
		// topo -m knows a bridge the plugin missed: the pair count differs.
		"NVLink": {"hgx-pcie-pairs", func(_ *testing.T, _ *machine, _, _, topo *string) {
			lines := strings.Split(*topo, "\n")
			lines[1] = strings.Replace(lines[1], "SYS", "NV4", 1)
			lines[3] = strings.Replace(lines[3], "SYS", "NV4", 1)
			*topo = strings.Join(lines, "\n")
		}, "NVLink peers: published 1, nvidia-smi topo -m shows 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := newMachine(t, tc.profile)
			s, q, topo := m.slices(t), m.smiQuery(), m.topo()
			tc.break_(t, m, &s, &q, &topo)
			out, err := m.check(t, s, q, topo, "")
			if !errors.Is(err, errMismatch) {
				t.Fatalf("error %v, want a mismatch\n%s", err, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("report lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

func TestActiveLinksAreCompared(t *testing.T) {
	m := newMachine(t, "dgx-h100")
	out, err := m.check(t, m.slices(t), m.smiQuery(), m.topo(), m.nvlinkStatus(func(i int) int { return 18 - i%2 }))
	if !errors.Is(err, errMismatch) || !strings.Contains(out, "MISMATCH: gpu-1 (nvidia-smi GPU 1) active NVLinks: published 18, the machine says 17") {
		t.Errorf("error %v; report:\n%s", err, out)
	}
}

func TestOneGPUSaysNothingAboutNVLink(t *testing.T) {
	m := newMachine(t, "pcie-only")
	m.inv.Devices = m.inv.Devices[:1]
	m.matrix = nil
	out, err := m.check(t, m.slices(t), m.smiQuery(), m.topo(), "")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "not checked: NVLink: this machine has 1 GPU") {
		t.Errorf("report does not say NVLink was not checked:\n%s", out)
	}
}

func TestParseTopoOfARealLayout(t *testing.T) {
	// Four PCIe cards bridged 0-2 and 1-3, as nvidia-smi prints them.
	const topo = "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
		"GPU0\t X \tSYS\tNV4\tSYS\tSYS\t0-31\t0\t\tN/A\n" +
		"GPU1\tSYS\t X \tSYS\tNV4\tSYS\t0-31\t0\t\tN/A\n" +
		"GPU2\tNV4\tSYS\t X \tSYS\tPHB\t32-63\t1\t\tN/A\n" +
		"GPU3\tSYS\tNV4\tSYS\t X \tPHB\t32-63\t1\t\tN/A\n" +
		"NIC0\tSYS\tSYS\tPHB\tPHB\t X \n\nLegend:\n\n  X    = Self\n"
	got, err := parseTopo([]byte(topo))
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 0, 4, 0}, {0, 0, 0, 4}, {4, 0, 0, 0}, {0, 4, 0, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseTopo = %v, want %v", got, want)
	}
	if _, err := parseTopo([]byte("GPU0\tGPU1\nGPU0\t X \tNV1\n")); err == nil {
		t.Error("a truncated matrix must be an error")
	}
}

// TestParseTopoOfAnH200 reads `nvidia-smi topo -m` as driver 580.159.04
// wrote it on a one-GPU H200 machine, header underlined with terminal
// escapes: the header's GPU0 must not be mistaken for the row's.
func TestParseTopoOfAnH200(t *testing.T) {
	data, err := os.ReadFile("testdata/topo-h200-1gpu.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "\x1b[4m") {
		t.Fatal("the recorded output lost its escapes")
	}
	got, err := parseTopo(data)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[[0]]" {
		t.Errorf("parseTopo = %v, want [[0]]", got)
	}
}

func TestCDICheck(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := func(mount string) string {
		p := filepath.Join(dir, "spec.json")
		content := `{"cdiVersion":"0.5.0","kind":"gputopo.dev/gpu","devices":[{"name":"c-gpu-0","containerEdits":{"deviceNodes":[{"path":"/dev/null"}]}}],` +
			`"containerEdits":{"mounts":[{"hostPath":"` + mount + `","containerPath":"/usr/lib/libcuda.so.1","options":["ro","bind"]}]}}`
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var out strings.Builder
	if err := run([]string{"cdi", spec(lib)}, &out); err != nil {
		t.Errorf("valid spec with existing paths: %v\n%s", err, out.String())
	}
	out.Reset()
	missing := filepath.Join(dir, "gone.so")
	if err := run([]string{"cdi", spec(missing)}, &out); !errors.Is(err, errMismatch) || !strings.Contains(out.String(), missing) {
		t.Errorf("missing mount source: %v\n%s", err, out.String())
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"cdiVersion":"0.5.0","kind":"gputopo.dev/gpu","devices":[{"name":"x","containerEdits":{}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"cdi", bad}, &out); err == nil || !strings.Contains(err.Error(), "CDI library rejects") {
		t.Errorf("invalid spec: %v", err)
	}
}

// TestScript runs hack/gpu-check.sh (which builds the bundle and runs its
// run.sh, dry: no container) on a machine whose nvidia-smi is a stand-in
// answering from recorded outputs and whose plugin publishes the same
// simulated GPUs: the script must pass, and fail once nvidia-smi
// disagrees; without a driver it must say so and exit 2.
func TestScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	m := newMachine(t, "dgx-h100")
	fake := func(query string) {
		files := map[string]string{
			"smi.txt":    m.smiBanner(),
			"query.csv":  query,
			"topo.txt":   m.topo(),
			"status.txt": m.nvlinkStatus(func(int) int { return 18 }),
		}
		for name, content := range files {
			m.write(t, filepath.Join("smi", name), content)
		}
		smi := filepath.Join(m.dir, "smi")
		m.write(t, "bin/nvidia-smi", `#!/usr/bin/env bash
case "$*" in
  "") cat `+smi+`/smi.txt ;;
  --query-gpu=*) cat `+smi+`/query.csv ;;
  "topo -m") cat `+smi+`/topo.txt ;;
  "nvlink --status") cat `+smi+`/status.txt ;;
  *) echo "unexpected nvidia-smi $*" >&2; exit 1 ;;
esac
`)
		if err := os.Chmod(filepath.Join(m.dir, "bin/nvidia-smi"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m.write(t, "proc/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
	run := func(cmd *exec.Cmd, driver string, env ...string) (string, error) {
		cmd.Env = append(append(os.Environ(),
			"PATH="+filepath.Join(m.dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
			"GPUCHECK_PLUGIN_ARGS=--backend=sim --profile=dgx-h100",
			"GPUCHECK_SYSFS="+m.sysfs,
			"GPUCHECK_NODE="+testNode,
			"GPUCHECK_DRIVER_PROC="+driver,
		), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	script := func() (string, error) {
		return run(exec.Command(bash, "../gpu-check.sh", filepath.Join(m.dir, "out"), "--dry-run"), filepath.Join(m.dir, "proc/version"))
	}

	fake(m.smiQuery())
	out, err := script()
	if err != nil || !strings.Contains(out, "gpu-check: OK (dry run") || !strings.Contains(out, "not checked: CDI spec names no host paths") {
		t.Fatalf("agreeing machine: %v\n%s", err, out)
	}
	fake(strings.ReplaceAll(m.smiQuery(), "550.54.15", "550.54.14"))
	out, err = script()
	if err == nil || !strings.Contains(out, "MISMATCH: gpu-0 (nvidia-smi GPU 0) driver version") || !strings.Contains(out, "gpu-check: MISMATCHES") {
		t.Errorf("disagreeing driver version: %v\n%s", err, out)
	}
	// The bundle the script built, on a machine without the driver.
	out, err = run(exec.Command(bash, filepath.Join(m.dir, "out/bundle/run.sh"), "--dry-run", filepath.Join(m.dir, "nodriver")), filepath.Join(m.dir, "proc/none"))
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out, "gpu-check: no NVIDIA driver found on this machine") {
		t.Errorf("no driver: %v\n%s", err, out)
	}

	// The bundle's step 3, which only a GPU machine reaches otherwise: the
	// nvml backend over a fake driver root whose libnvidia-ml.so.1 is the
	// NVML stand-in, answering for the machine's GPUs, and a container
	// started with the bundle's runc and the spec of a claim for gpu-0,
	// running the driver root's nvidia-smi (a stand-in listing the GPUs
	// whose device nodes it sees). NUMA and PCIe roots come from this
	// machine's /sys for the nvml backend, so step 1 may disagree with the
	// simulated tree; only steps 2 and 3 are judged here.
	if os.Geteuid() != 0 {
		t.Skip("starting a container with runc needs root")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("the NVML stand-in is built with gcc")
	}
	// The rootfs's loader configuration reaches the drop-in that the hook's
	// update-ldcache writes for a driver outside the system folders (on an
	// H200 with its driver in /usr/local/nvidia/lib64 it once did not, and
	// the container's nvidia-smi found no libnvidia-ml.so.1).
	if ldconfig, err := exec.LookPath("ldconfig"); err == nil {
		rootfs := filepath.Join(t.TempDir(), "rootfs")
		if out, err := exec.Command("cp", "-a", filepath.Join(m.dir, "out/bundle/rootfs"), rootfs).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		probe := filepath.Join(rootfs, "usr/local/nvidia/lib64")
		if err := os.MkdirAll(probe, 0o755); err != nil {
			t.Fatal(err)
		}
		lib, err := os.ReadFile(filepath.Join(rootfs, "lib/x86_64-linux-gnu/libgcc_s.so.1"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(probe, "libgcc_s.so.1"), lib, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(rootfs, "etc/ld.so.conf.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, "etc/ld.so.conf.d/00-nvcr-test.conf"), []byte("/usr/local/nvidia/lib64\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(ldconfig, "-r", rootfs, "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache").CombinedOutput(); err != nil {
			t.Fatalf("ldconfig on the bundle's rootfs: %v: %s", err, out)
		}
		cache, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(cache), "/usr/local/nvidia/lib64/libgcc_s.so.1") {
			t.Error("the bundle's rootfs/etc/ld.so.conf does not include /etc/ld.so.conf.d: a driver's folder added there by update-ldcache is not in the container's loader cache")
		}
	}
	root := filepath.Join(m.dir, "driver")
	cfg := nvmltest.Config{CUDAVersion: 12040}
	var list strings.Builder
	for _, d := range m.inv.Devices {
		cfg.GPUs = append(cfg.GPUs, nvmltest.GPU{
			UUID: d.UUID, Name: d.ProductName, BusID: d.PCIBusID, Minor: d.Minor, MemoryBytes: uint64(d.MemoryBytes),
			Architecture: gonvml.DEVICE_ARCH_HOPPER, ComputeCapability: [2]int{9, 0}, NVLinks: 18,
		})
		fmt.Fprintf(&list, "[ -e /dev/nvidia%d ] && { echo \"GPU $i: %s (UUID: %s)\"; i=$((i+1)); }\n", d.Minor, d.ProductName, d.UUID)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nvmltest.FakeDriver(root, cfg); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(root, "usr/bin/nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\n# nvidia-smi -L as the container sees its GPUs\ni=0\n"+list.String()+"exit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	fake(m.smiQuery()) // nvidia-smi on the host agrees again
	cmd := exec.Command(bash, filepath.Join(m.dir, "out/bundle/run.sh"), filepath.Join(m.dir, "container"))
	out, err = run(cmd, filepath.Join(m.dir, "proc/version"), "GPUCHECK_PLUGIN_ARGS=--backend=nvml", "NVIDIA_DRIVER_ROOT="+root)
	want := fmt.Sprintf("ok: the container sees exactly the claim's GPU (gpu-0, %s)", m.inv.Devices[0].UUID)
	if !strings.Contains(out, want) {
		t.Errorf("the bundle's container over the fake driver: %v; want %q in:\n%s", err, want, out)
	}
}
