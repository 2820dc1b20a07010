package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// cpuRoot is where the cgroup v1 cpu controller or the cgroup v2 hierarchy
// is mounted.
var cpuRoot = "/sys/fs/cgroup"

// cpuGroupDir is the cpu cgroup that holds the cluster in dir's weighted
// processes, one child per process: a name from the directory, so that
// clusters side by side keep apart and Down finds it again.
func cpuGroupDir(dir string) (string, bool) {
	sum := sha256.Sum256([]byte(dir))
	name := "gputopo-" + hex.EncodeToString(sum[:6])
	if _, err := os.Stat(filepath.Join(cpuRoot, "cpu", "cpu.shares")); err == nil {
		return filepath.Join(cpuRoot, "cpu", name), true // v1
	}
	return filepath.Join(cpuRoot, name), false // v2
}

// MilliCPUToShares is kubelet's cpu.shares for a container that requests
// milli millicores (pkg/kubelet/cm.MilliCPUToShares): 1024 per core, at
// least 2.
func MilliCPUToShares(milli int64) int64 {
	return max(2, milli*1024/1000)
}

// sharesToWeight is the cgroup v2 cpu.weight kubelet writes for shares
// (k8s.io/kubernetes/pkg/kubelet/cm CpuSharesToCpuWeight).
func sharesToWeight(shares int64) int64 {
	return 1 + ((shares-2)*9999)/262142
}

// weighCPU moves process pid into its own cpu cgroup under the cluster's,
// weighted as kubelet weighs a container that requests milli millicores,
// so that under contention the processes share the CPUs as their pods
// would on a node.
func weighCPU(dir, name string, pid int, milli int64) error {
	group, v1 := cpuGroupDir(dir)
	child := filepath.Join(group, name)
	if err := os.MkdirAll(child, 0o755); err != nil {
		return fmt.Errorf("cpu cgroup for %s (Config.CPURequests needs a writable cpu cgroup; leave it empty where there is none): %w", name, err)
	}
	shares := MilliCPUToShares(milli)
	file, value := "cpu.shares", shares
	if !v1 {
		if err := os.WriteFile(filepath.Join(group, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
			return fmt.Errorf("enable the cpu controller in %s: %w", group, err)
		}
		file, value = "cpu.weight", sharesToWeight(shares)
	}
	if err := os.WriteFile(filepath.Join(child, file), []byte(strconv.FormatInt(value, 10)), 0o644); err != nil {
		return fmt.Errorf("weigh %s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("move %s into %s: %w", name, child, err)
	}
	return nil
}

// removeCPUGroups removes the cluster's cpu cgroups once its processes are
// gone; a group still holding a process stays, and is reported.
func removeCPUGroups(dir string) error {
	group, _ := cpuGroupDir(dir)
	children, err := os.ReadDir(group)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, c := range children {
		if c.IsDir() {
			if err := os.Remove(filepath.Join(group, c.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.Remove(group); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
