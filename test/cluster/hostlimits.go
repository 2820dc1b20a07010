package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// What a cluster takes from the host's limits. Kubelets watch their plugin
// registry, pod sources, certificates and cgroups with inotify: two
// clusters of 8 kubelets each exhausted the default 128 inotify instances
// per user (the kubelets logged "failed to start plugin fsWatcher, err: too
// many open files" and never registered the DRA plugin). Every process of
// the cluster inherits the harness's open-file limit, and the harness
// serves each node's fake CRI.
const (
	inotifyInstancesPerKubelet = 8
	inotifyWatchesPerKubelet   = 512
	// inotifyHeadroom: the control plane, the plugins, containerd and
	// whatever else the same user runs meanwhile.
	inotifyInstancesHeadroom = 32
	inotifyWatchesHeadroom   = 8192
	openFilesBase            = 4096
	// A real node: its kubelet, fake CRI or containerd and plugin. A fake
	// node (no kubelet) is a few objects the harness keeps alive over its
	// one API connection: 5,000 of them ran under 20,000 open files.
	openFilesPerRealNode = 256
	openFilesPerFakeNode = 2
)

// Paths of the inotify limits, per user.
const (
	sysctlInotifyInstances = "/proc/sys/fs/inotify/max_user_instances"
	sysctlInotifyWatches   = "/proc/sys/fs/inotify/max_user_watches"
)

// HostLimits are the host limits a cluster depends on.
type HostLimits struct {
	// InotifyInstances and InotifyWatches are fs.inotify.max_user_instances
	// and max_user_watches; InotifyInstancesUsed is how many instances the
	// user's processes hold now (other clusters included).
	InotifyInstances, InotifyWatches int
	InotifyInstancesUsed             int
	// OpenFiles and OpenFilesHard are this process's RLIMIT_NOFILE, which
	// every process of the cluster inherits.
	OpenFiles, OpenFilesHard uint64
}

// HostNeeds is what a cluster of that many kubelets needs.
type HostNeeds struct {
	InotifyInstances, InotifyWatches int
	OpenFiles                        uint64
}

// NeedsFor returns what a cluster with realNodes kubelets and nodes nodes
// in all needs on top of what the user's processes already use.
func NeedsFor(realNodes, nodes int) HostNeeds {
	return HostNeeds{
		InotifyInstances: realNodes*inotifyInstancesPerKubelet + inotifyInstancesHeadroom,
		InotifyWatches:   realNodes*inotifyWatchesPerKubelet + inotifyWatchesHeadroom,
		OpenFiles:        openFilesBase + uint64(realNodes)*openFilesPerRealNode + uint64(max(nodes-realNodes, 0))*openFilesPerFakeNode,
	}
}

// LimitFix is one limit to raise: how, and the command a person runs when
// the harness cannot.
type LimitFix struct {
	Name    string
	Have    uint64
	Want    uint64
	Command string
	// sysctl is the file to write (inotify), or empty for RLIMIT_NOFILE.
	sysctl string
	// soft: RLIMIT_NOFILE only up to the hard limit, which needs no root.
	soft bool
}

// PlanLimits decides which limits to raise for needs: the inotify sysctls
// (root only) so that the instances in use plus the cluster's fit, and the
// open-file limit (the soft limit up to the hard one by anyone; beyond it,
// root only). It returns what it can raise and what a person must raise.
func PlanLimits(have HostLimits, needs HostNeeds, root bool) (raise, manual []LimitFix) {
	add := func(f LimitFix, canRaise bool) {
		if canRaise {
			raise = append(raise, f)
		} else {
			manual = append(manual, f)
		}
	}
	if want := have.InotifyInstancesUsed + needs.InotifyInstances; have.InotifyInstances < want {
		want = roundUpPow2(want)
		add(LimitFix{Name: "fs.inotify.max_user_instances", Have: uint64(have.InotifyInstances), Want: uint64(want),
			Command: fmt.Sprintf("sudo sysctl -w fs.inotify.max_user_instances=%d", want), sysctl: sysctlInotifyInstances}, root)
	}
	if have.InotifyWatches < needs.InotifyWatches {
		want := roundUpPow2(needs.InotifyWatches)
		add(LimitFix{Name: "fs.inotify.max_user_watches", Have: uint64(have.InotifyWatches), Want: uint64(want),
			Command: fmt.Sprintf("sudo sysctl -w fs.inotify.max_user_watches=%d", want), sysctl: sysctlInotifyWatches}, root)
	}
	if have.OpenFiles < needs.OpenFiles {
		f := LimitFix{Name: "open files (ulimit -n)", Have: have.OpenFiles, Want: needs.OpenFiles,
			Command: fmt.Sprintf("ulimit -n %d (in the shell that runs the tests; above the hard limit %d, as root or through /etc/security/limits.conf)", needs.OpenFiles, have.OpenFilesHard)}
		f.soft = needs.OpenFiles <= have.OpenFilesHard
		add(f, f.soft || root)
	}
	return raise, manual
}

func roundUpPow2(n int) int {
	p := 128
	for p < n {
		p *= 2
	}
	return p
}

// LimitsError says which host limits keep a cluster from starting, and
// the commands that raise them.
type LimitsError struct{ Fixes []LimitFix }

func (e *LimitsError) Error() string {
	var b strings.Builder
	b.WriteString("host limits too low for this cluster (kubelets would fail with \"too many open files\"); raise them and start again:")
	for _, f := range e.Fixes {
		fmt.Fprintf(&b, "\n  %s is %d, needs %d: %s", f.Name, f.Have, f.Want, f.Command)
	}
	return b.String()
}

// ReadHostLimits reads the host's limits and the inotify instances the
// user's processes hold.
func ReadHostLimits() (HostLimits, error) {
	var h HostLimits
	var err error
	if h.InotifyInstances, err = readIntFile(sysctlInotifyInstances); err != nil {
		return h, err
	}
	if h.InotifyWatches, err = readIntFile(sysctlInotifyWatches); err != nil {
		return h, err
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return h, fmt.Errorf("read the open-file limit: %w", err)
	}
	h.OpenFiles, h.OpenFilesHard = rl.Cur, rl.Max
	h.InotifyInstancesUsed = inotifyInstancesOf(os.Getuid())
	return h, nil
}

// inotifyInstancesOf counts the inotify file descriptors of uid's
// processes: the instances counted against max_user_instances.
func inotifyInstancesOf(uid int) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	n := 0
	for _, p := range procs {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil || int(st.Uid) != uid {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(p, "fd"))
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(p, "fd", fd.Name())); err == nil && target == "anon_inode:inotify" {
				n++
			}
		}
	}
	return n
}

func readIntFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

// EnsureHostLimits checks the host's limits against what a cluster with
// realNodes kubelets among nodes needs, raises what it can (the inotify
// sysctls as root, the open-file limit of this process, which the
// cluster's processes inherit), and otherwise returns a *LimitsError with
// the commands to run. progress receives a line per limit raised.
func EnsureHostLimits(realNodes, nodes int, progress func(format string, args ...any)) error {
	have, err := ReadHostLimits()
	if err != nil {
		return fmt.Errorf("check host limits: %w", err)
	}
	raise, manual := PlanLimits(have, NeedsFor(realNodes, nodes), os.Geteuid() == 0)
	for _, f := range raise {
		if err := applyFix(f); err != nil {
			manual = append(manual, f)
			progress("could not raise %s from %d to %d: %v", f.Name, f.Have, f.Want, err)
			continue
		}
		progress("raised %s from %d to %d", f.Name, f.Have, f.Want)
	}
	if len(manual) > 0 {
		return &LimitsError{Fixes: manual}
	}
	// Go raises its own soft open-file limit to the hard one at start but
	// gives child processes the soft limit it found, unless the program set
	// one itself: setting it passes what was read above on to the cluster.
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil {
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	return nil
}

func applyFix(f LimitFix) error {
	if f.sysctl != "" {
		return os.WriteFile(f.sysctl, []byte(strconv.FormatUint(f.Want, 10)+"\n"), 0o644)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return err
	}
	rl.Cur = f.Want
	if rl.Max < f.Want {
		rl.Max = f.Want
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return errors.Join(errors.New("setrlimit"), err)
	}
	return nil
}
