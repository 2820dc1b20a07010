package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

// downTopology is a small cluster as `make demo` starts it: real nodes on
// the fake CRI and on containerd (three kubelets, so three private mount
// namespaces; containerd's shims and containers in the last) and a fake one.
const downTopology = `spines: 1
leavesPerSpine: 1
nodesPerLeaf: 4
profiles: [dgx-h100, dgx1-v100]
realNodes: 3
containerdNodes: 1
`

// TestClusterDownLeavesNothing proves the README's "`make demo-down` stops
// it and leaves no process or mount behind": it starts a cluster with
// `localcluster up` and the arguments demo/local.sh gives it (the gputopo
// plugin and controller, the admission manifests), runs a pod with a claim
// on each real node, records what the cluster holds, runs `localcluster down`, and checks that nothing of it is left:
// no process, no mount (here or in the kubelets' namespaces), no open unix
// socket and no listening TCP port.
func TestClusterDownLeavesNothing(t *testing.T) {
	binDir := needClusterBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	bins := t.TempDir()
	localcluster := filepath.Join(bins, "localcluster")
	goBuild(t, ".", localcluster, "./cmd/localcluster")
	pluginBin, controllerBin := productBinaries(t, bins)
	private := []string{localcluster}
	if filepath.Dir(pluginBin) == bins {
		private = append(private, pluginBin, controllerBin)
	}

	// Short: the kubelets' unix sockets live under it (107 bytes at most).
	dir, err := os.MkdirTemp("", "gputopo-down-")
	if err != nil {
		t.Fatal(err)
	}
	topology := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(topology, []byte(downTopology), 0o644); err != nil {
		t.Fatal(err)
	}
	manifests, err := filepath.Abs("../../deployments/admission")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever the test found, nothing stays running or on disk.
		exec.Command(localcluster, "down", "--dir", dir).Run()
		if t.Failed() {
			t.Logf("cluster dir %s kept for inspection", dir)
			return
		}
		os.RemoveAll(dir)
	})

	start := time.Now()
	up := exec.CommandContext(ctx, localcluster, "up", "--topology", topology, "--dir", dir, "--bin-dir", binDir,
		"--plugin-bin", pluginBin, "--controller-bin", controllerBin, "--manifest", manifests)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("localcluster up: %v\n%s", err, out)
	}
	t.Logf("localcluster up: ready in %s", time.Since(start).Round(100*time.Millisecond))
	ready, err := cluster.ReadReady(dir)
	if err != nil {
		t.Fatal(err)
	}

	// A running pod with a claim on each real node, as after `make demo`:
	// prepared claims, and the kubelet's volume mounts for the pod.
	attached, err := cluster.Attach(dir)
	if err != nil {
		t.Fatal(err)
	}
	client := attached.Client()
	createDRAObjects(ctx, t, client)
	for _, n := range ready.Nodes {
		if n.Real {
			waitRunning(ctx, t, client, createPod(ctx, t, client, n.Name, "p-"+n.Name))
		}
	}

	// What the cluster holds, found the way the checks after down look.
	before := scanLeftovers(t, dir, private)
	wantProcs := map[int]string{ready.SupervisorPID: "supervisor"}
	for name, pid := range ready.PIDs {
		wantProcs[pid] = name
	}
	var kubeletNS []string
	for pid, name := range wantProcs {
		if !slices.ContainsFunc(before.procs, func(p leftProc) bool { return p.pid == pid }) {
			t.Errorf("the scan does not see %s (pid %d) of the running cluster: %v", name, pid, before.procs)
		}
		if strings.HasPrefix(name, "kubelet-") {
			ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
			if err != nil {
				t.Fatalf("mount namespace of %s: %v", name, err)
			}
			kubeletNS = append(kubeletNS, ns)
			// The pod's volumes are mounted in the kubelet's namespace only.
			if mounts := mountsUnder(t, fmt.Sprintf("/proc/%d/mountinfo", pid), dir); !slices.ContainsFunc(mounts, func(m string) bool { return m != dir }) {
				t.Errorf("%s has no mount under the cluster dir while its pod runs", name)
			}
		}
	}
	for _, want := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "controller"} {
		if _, ok := ready.PIDs[want]; !ok {
			t.Errorf("ready file names no %s: %v", want, ready.PIDs)
		}
	}
	for _, n := range ready.Nodes {
		_, kubelet := ready.PIDs["kubelet-"+n.Name]
		_, plugin := ready.PIDs["plugin-"+n.Name]
		if n.Real && (!kubelet || !plugin) {
			t.Errorf("ready file lacks the kubelet or plugin of real node %s: %v", n.Name, ready.PIDs)
		}
	}
	// What the host mounts under the cluster dir reaches the containerd
	// node (whose kubelet is in containerd's namespace), as the plugin's
	// MPS tmpfs must, and only there.
	probe := filepath.Join(dir, "propagation-probe")
	if err := os.MkdirAll(probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("gputopo-probe", probe, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatalf("mount a tmpfs under the cluster dir: %v", err)
	}
	seen := 0
	for pid, name := range wantProcs {
		if strings.HasPrefix(name, "kubelet-") && slices.Contains(mountsUnder(t, fmt.Sprintf("/proc/%d/mountinfo", pid), dir), probe) {
			seen++
		}
	}
	if err := syscall.Unmount(probe, 0); err != nil {
		t.Fatal(err)
	}
	if seen != 1 {
		t.Errorf("a tmpfs the host mounted under the cluster dir is seen by %d kubelets' namespaces, want 1 (the containerd node's)", seen)
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	if len(kubeletNS) != 3 || slices.Contains(kubeletNS, self) {
		t.Errorf("kubelets' mount namespaces %v, want three of their own (this process: %s)", kubeletNS, self)
	}
	if len(before.sockets) == 0 {
		t.Error("the scan sees no unix socket of the running cluster")
	}
	ports := clusterPorts(t, dir, ready)
	listening := listeningPorts(t)
	for port, what := range ports {
		if listening[port] == 0 {
			t.Errorf("%s (port %d) does not listen while the cluster runs", what, port)
		}
	}
	if t.Failed() {
		t.FailNow() // the checks below would prove nothing
	}

	start = time.Now()
	if out, err := exec.CommandContext(ctx, localcluster, "down", "--dir", dir).CombinedOutput(); err != nil {
		t.Fatalf("localcluster down: %v\n%s", err, out)
	}
	t.Logf("localcluster down took %s", time.Since(start).Round(100*time.Millisecond))

	after := scanLeftovers(t, dir, private)
	for _, p := range after.procs {
		t.Errorf("process left after down: %s", p)
	}
	for _, m := range after.mounts {
		t.Errorf("mount left after down: %s", m)
	}
	for _, s := range after.sockets {
		t.Errorf("unix socket still open after down: %s", s)
	}
	for _, ns := range kubeletNS {
		for _, pid := range processesIn(t, ns) {
			t.Errorf("a kubelet's mount namespace %s is still held by pid %d (%s)", ns, pid, cmdline(pid))
		}
	}
	listening = listeningPorts(t)
	for port, what := range ports {
		if inode := listening[port]; inode != 0 {
			t.Errorf("port %d (%s) still listens after down (socket inode %d)", port, what, inode)
		}
	}
	if pid := cluster.RunningPID(dir); pid != 0 {
		t.Errorf("supervisor pid %d still running after down", pid)
	}
	// down is idempotent: again on the stopped cluster, it succeeds.
	if out, err := exec.CommandContext(ctx, localcluster, "down", "--dir", dir).CombinedOutput(); err != nil {
		t.Errorf("second localcluster down: %v\n%s", err, out)
	}
}

// goBuild builds pkg of the module in modDir into out.
func goBuild(t *testing.T, modDir, out string, pkgs ...string) {
	t.Helper()
	// The flags of `make build`, so the build cache is shared with it.
	args := append([]string{"build", "-tags=grpcnotrace", "-ldflags=-s -w", "-o", out}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = modDir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v in %s: %v\n%s", pkgs, modDir, err, b)
	}
}

// productBinaries returns the gputopo kubelet plugin and controller:
// $GPUTOPO_BIN's (`make e2e` builds them there), else built into dir.
func productBinaries(t *testing.T, dir string) (plugin, controller string) {
	t.Helper()
	if bin := os.Getenv("GPUTOPO_BIN"); bin != "" {
		plugin, controller = filepath.Join(bin, "gputopo-kubelet-plugin"), filepath.Join(bin, "gputopo-controller")
		_, perr := os.Stat(plugin)
		_, cerr := os.Stat(controller)
		if perr == nil && cerr == nil {
			return plugin, controller
		}
	}
	goBuild(t, "../..", dir+"/", "./cmd/gputopo-kubelet-plugin", "./cmd/gputopo-controller")
	return filepath.Join(dir, "gputopo-kubelet-plugin"), filepath.Join(dir, "gputopo-controller")
}

// clusterPorts are the TCP ports the ready file and DIR/run/controller.addr
// say the cluster listens on, each with what listens there.
func clusterPorts(t *testing.T, dir string, ready *cluster.ReadyInfo) map[int]string {
	t.Helper()
	ports := map[int]string{
		ready.Ports.Etcd: "etcd", ready.Ports.EtcdPeer: "etcd peer", ready.Ports.APIServer: "kube-apiserver",
		ready.Ports.ControllerManager: "kube-controller-manager", ready.Ports.Scheduler: "kube-scheduler",
	}
	for _, n := range ready.Nodes {
		if n.Real {
			ports[n.KubeletPort] = "kubelet of " + n.Name
			ports[n.HealthzPort] = "kubelet healthz of " + n.Name
			ports[n.MetricsPort] = "plugin metrics of " + n.Name
		}
	}
	addr, err := os.ReadFile(filepath.Join(dir, "run", "controller.addr"))
	if err != nil {
		t.Fatalf("controller address: %v", err)
	}
	_, p, _ := strings.Cut(string(addr), ":")
	port, err := strconv.Atoi(strings.TrimSpace(p))
	if err != nil {
		t.Fatalf("controller address %q: %v", addr, err)
	}
	ports[port] = "controller metrics"
	delete(ports, 0)
	return ports
}

// leftovers is what of a cluster the host still holds.
type leftovers struct {
	procs   []leftProc
	mounts  []string // mount points under the cluster dir, in this namespace
	sockets []string // open unix sockets bound under the cluster dir
}

type leftProc struct {
	pid int
	why string
}

func (p leftProc) String() string {
	return fmt.Sprintf("pid %d (%s): %s", p.pid, cmdline(p.pid), p.why)
}

// scanLeftovers finds, in /proc, every live process other than this one
// that names dir on its command line, runs in it, holds a file under it or
// runs one of the binaries in private (built for this test alone; the
// Kubernetes binaries are shared with other clusters, so they count only
// with dir); the mounts under dir; and the unix sockets bound under dir.
func scanLeftovers(t *testing.T, dir string, private []string) leftovers {
	t.Helper()
	var l leftovers
	under := func(path string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !liveProcess(pid) {
			continue
		}
		var why string
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && slices.Contains(private, exe) {
			why = "runs " + exe
		} else if strings.Contains(cmdline(pid), dir) {
			why = "command line names the cluster dir"
		} else if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && under(cwd) {
			why = "runs in " + cwd
		} else {
			fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
			for _, fd := range fds {
				if target, err := os.Readlink(fd); err == nil && under(target) {
					why = "holds " + target
					break
				}
			}
		}
		if why != "" {
			l.procs = append(l.procs, leftProc{pid: pid, why: why})
		}
	}
	l.mounts = mountsUnder(t, "/proc/self/mountinfo", dir)
	unix, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(unix), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode [Path]
		if f := strings.Fields(line); len(f) > 7 && under(f[7]) {
			l.sockets = append(l.sockets, f[7])
		}
	}
	return l
}

// mountsUnder returns the mount points under dir, and dir itself, that a
// mountinfo file lists.
func mountsUnder(t *testing.T, mountinfo, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (unescapeOctal(f[4]) == dir || strings.HasPrefix(unescapeOctal(f[4]), dir+"/")) {
			mounts = append(mounts, unescapeOctal(f[4]))
		}
	}
	return mounts
}

// unescapeOctal undoes mountinfo's \NNN escapes.
func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// liveProcess reports whether pid exists and is not a zombie (a zombie holds
// no files, sockets or mounts; only its parent can reap it).
func liveProcess(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(stat[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// processesIn returns the live processes in mount namespace ns ("mnt:[N]").
func processesIn(t *testing.T, ns string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !liveProcess(pid) {
			continue
		}
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && got == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// listeningPorts maps each TCP port in LISTEN state, IPv4 or IPv6, to the
// inode of its socket.
func listeningPorts(t *testing.T) map[int]uint64 {
	t.Helper()
	ports := map[int]uint64{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for port, inode := range parseListening(string(data)) {
			ports[port] = inode
		}
	}
	return ports
}

// parseListening reads /proc/net/tcp or tcp6: the local port and socket
// inode of every socket in state 0A (LISTEN).
func parseListening(table string) map[int]uint64 {
	ports := map[int]uint64{}
	for _, line := range strings.Split(table, "\n")[1:] {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		port, err := strconv.ParseUint(hexPort, 16, 16)
		inode, ierr := strconv.ParseUint(f[9], 10, 64)
		if ok && err == nil && ierr == nil {
			ports[int(port)] = inode
		}
	}
	return ports
}

func TestParseListening(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9C41 0100007F:D2A8 01 00000000:00000000 00:00000000 00000000     0        0 123457 1 0000000000000000 20 4 30 10 -1
   2: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 100 0 0 10 0
`
	got := parseListening(table)
	want := map[int]uint64{0x9C41: 123456, 0x1F90: 99}
	if !maps.Equal(got, want) {
		t.Errorf("parseListening = %v, want %v (established sockets left out)", got, want)
	}
}

func TestUnescapeOctal(t *testing.T) {
	if got := unescapeOctal(`/tmp/a\040b\134c`); got != `/tmp/a b\c` {
		t.Errorf("unescapeOctal = %q", got)
	}
}

// The scan of TestClusterDownLeavesNothing sees a process that runs in the
// directory, a unix socket bound in it and, as root, a mount under it; and
// none of them once they are gone.
func TestScanLeftoversSeesWhatItLooksFor(t *testing.T) {
	dir := t.TempDir()
	child := exec.Command("sleep", "600")
	child.Dir = dir
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	l, err := net.Listen("unix", filepath.Join(dir, "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mnt := filepath.Join(dir, "mnt")
	mounted := false
	if os.Geteuid() == 0 {
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
			t.Logf("cannot mount here (%v); the mount check goes untested", err)
		} else {
			mounted = true
			defer syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}

	got := scanLeftovers(t, dir, nil)
	if !slices.ContainsFunc(got.procs, func(p leftProc) bool { return p.pid == child.Process.Pid }) {
		t.Errorf("scan missed pid %d running in %s: %v", child.Process.Pid, dir, got.procs)
	}
	if !slices.Contains(got.sockets, filepath.Join(dir, "s.sock")) {
		t.Errorf("scan missed the socket: %v", got.sockets)
	}
	if mounted && !slices.Contains(got.mounts, mnt) {
		t.Errorf("scan missed the mount %s: %v", mnt, got.mounts)
	}

	child.Process.Kill()
	child.Wait()
	l.Close()
	if mounted {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := scanLeftovers(t, dir, nil); len(got.procs)+len(got.sockets)+len(got.mounts) > 0 {
		t.Errorf("scan after everything ended: %+v", got)
	}
}
