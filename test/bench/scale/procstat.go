package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// ProcStat is a process's CPU time and memory as /proc shows them.
type ProcStat struct {
	Name       string
	PID        int
	CPUSeconds float64
	// RSS is the resident set now, PeakRSS the largest it has been (VmHWM).
	RSS, PeakRSS uint64
	// RSSAnon is the part of RSS that is heap and stacks, RSSFile the
	// mapped files: mostly the binary's own pages.
	RSSAnon, RSSFile uint64
}

// MiB renders bytes in MiB.
func MiB(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 0, 64) }

// ReadProc reads /proc for pid.
func ReadProc(name string, pid int) (ProcStat, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return ProcStat{}, fmt.Errorf("read /proc of %s (pid %d): %w", name, pid, err)
	}
	stat, err := p.Stat()
	if err != nil {
		return ProcStat{}, fmt.Errorf("read /proc/%d/stat of %s: %w", pid, name, err)
	}
	status, err := p.NewStatus()
	if err != nil {
		return ProcStat{}, fmt.Errorf("read /proc/%d/status of %s: %w", pid, name, err)
	}
	return ProcStat{Name: name, PID: pid, CPUSeconds: stat.CPUTime(), RSS: status.VmRSS, PeakRSS: status.VmHWM,
		RSSAnon: status.RssAnon, RSSFile: status.RssFile}, nil
}

// ClusterProc reads a process of the local cluster by its name there
// (etcd, kube-apiserver, controller, plugin-NODE, ...), through the pid
// file the harness keeps in DIR/run.
func ClusterProc(dir, name string) (ProcStat, error) {
	pid, err := pidFromFile(filepath.Join(dir, "run", name+".pid"))
	if err != nil {
		return ProcStat{}, fmt.Errorf("find %s: %w", name, err)
	}
	return ReadProc(name, pid)
}

// pidFromFile reads the harness's pid file: "PID STARTTIME".
func pidFromFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0, fmt.Errorf("pid file %s is empty", path)
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q is not a pid", path, fields[0])
	}
	return pid, nil
}

// ControlPlane are the processes whose memory every run records.
var ControlPlane = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}

// Memory reads the named cluster processes; a process that is not running
// is left out.
func Memory(dir string, names ...string) []ProcStat {
	var out []ProcStat
	for _, n := range names {
		if s, err := ClusterProc(dir, n); err == nil {
			out = append(out, s)
		}
	}
	return out
}
