package cluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestMilliCPUToShares(t *testing.T) {
	// kubelet's figures: 1024 per core, at least 2; cgroup v2 maps 1024
	// shares to weight 39 and 2 to 1.
	for milli, want := range map[int64]int64{1000: 1024, 250: 256, 100: 102, 1: 2, 0: 2} {
		if got := MilliCPUToShares(milli); got != want {
			t.Errorf("MilliCPUToShares(%d) = %d, want %d", milli, got, want)
		}
	}
	for shares, want := range map[int64]int64{1024: 39, 2: 1, 262144: 10000} {
		if got := sharesToWeight(shares); got != want {
			t.Errorf("sharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
}

func TestWeighCPU(t *testing.T) {
	read := func(t *testing.T, path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, v1 := range []bool{true, false} {
		root := t.TempDir()
		old := cpuRoot
		cpuRoot = root
		t.Cleanup(func() { cpuRoot = old })
		if v1 {
			if err := os.MkdirAll(filepath.Join(root, "cpu"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "cpu", "cpu.shares"), []byte("1024"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		dir := "/clusters/a"
		if err := weighCPU(dir, "kube-apiserver", 4242, 250); err != nil {
			t.Fatal(err)
		}
		group, gotV1 := cpuGroupDir(dir)
		if gotV1 != v1 {
			t.Fatalf("v1 = %v, want %v", gotV1, v1)
		}
		if other, _ := cpuGroupDir("/clusters/b"); other == group {
			t.Errorf("two clusters share the cgroup %s", group)
		}
		child := filepath.Join(group, "kube-apiserver")
		if got := read(t, filepath.Join(child, "cgroup.procs")); got != "4242" {
			t.Errorf("cgroup.procs = %q, want the pid", got)
		}
		if v1 {
			if got := read(t, filepath.Join(child, "cpu.shares")); got != "256" {
				t.Errorf("cpu.shares = %q, want 256 for 250m", got)
			}
		} else {
			if got := read(t, filepath.Join(child, "cpu.weight")); got != "10" {
				t.Errorf("cpu.weight = %q, want 10 for 250m", got)
			}
			if got := read(t, filepath.Join(group, "cgroup.subtree_control")); got != "+cpu" {
				t.Errorf("cgroup.subtree_control = %q, want +cpu", got)
			}
		}
		// A real cgroup's directory holds only interface files, which rmdir
		// takes with it; the stand-ins here are plain files.
		for _, f := range []string{"cgroup.procs", "cpu.shares", "cpu.weight"} {
			os.Remove(filepath.Join(child, f))
		}
		os.Remove(filepath.Join(group, "cgroup.subtree_control"))
		if err := removeCPUGroups(dir); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(group); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", group, err)
		}
		if err := removeCPUGroups(dir); err != nil {
			t.Errorf("a second removal: %v", err)
		}
	}
}

// TestCPURequestsWeighProcesses starts a process with a CPU request on
// this machine's cpu cgroup: it must run in its own group with kubelet's
// shares, and Stop must remove the groups.
func TestCPURequestsWeighProcesses(t *testing.T) {
	probe := filepath.Join(cpuRoot, "cpu", "gputopo-probe-"+filepath.Base(t.TempDir()))
	if os.Geteuid() != 0 || os.Mkdir(probe, 0o755) != nil {
		t.Skip("needs root and a writable cgroup v1 cpu controller")
	}
	os.Remove(probe)
	dir := t.TempDir()
	c := &Cluster{cfg: Config{CPURequests: map[string]int64{"sleeper": 250}}, dir: dir, owner: true, procs: map[string]*proc{}}
	if err := c.launch("sleeper", "sleep", "60"); err != nil {
		t.Fatal(err)
	}
	pid := c.procByName("sleeper").pid
	group, _ := cpuGroupDir(dir)
	cg, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(filepath.Join(group, "sleeper"), filepath.Join(cpuRoot, "cpu"))
	if !strings.Contains(string(cg), ":cpu:"+want+"\n") {
		t.Errorf("the process's cgroups:\n%s\nwant cpu:%s", cg, want)
	}
	if b, err := os.ReadFile(filepath.Join(group, "sleeper", "cpu.shares")); err != nil || strings.TrimSpace(string(b)) != "256" {
		t.Errorf("cpu.shares = %q (%v), want 256 for 250m", b, err)
	}
	c.Stop()
	if _, err := os.Stat(group); !os.IsNotExist(err) {
		t.Errorf("Stop left %s behind: %v", group, err)
	}
}
