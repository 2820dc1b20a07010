package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/util"

	"github.com/gputopo/gputopo/pkg/clustertopo"
)

// Nodes with runtime containerd run their pods for real: containerd from
// ContainerdBinaries with runc, in a mount and PID namespace of their own
// that the kubelet joins, so that every mount, network namespace and
// container is gone when containerd exits.
const (
	// LabelRuntime is set to the runtime on nodes that run containerd;
	// harness-only, not a product label.
	LabelRuntime = "localcluster.gputopo.dev/runtime"
	// TaintRuntime (value RuntimeContainerd, effect NoSchedule) keeps pods
	// off a containerd node unless they tolerate it: only the local images
	// (ImageBusybox, ImagePause) exist there and no registry is reachable.
	TaintRuntime = LabelRuntime
	// RuntimeContainerd is NodeSpec.Runtime of a node that runs containerd.
	RuntimeContainerd = clustertopo.RuntimeContainerd
)

// containerdProcPrefix starts the name of a node's containerd process.
const containerdProcPrefix = "containerd-"

// The runc and busybox of the host, from Debian's runc and busybox-static.
const (
	RuncBinary    = "runc"
	BusyboxBinary = "/bin/busybox"
	// runtimeDepsHint says how to get them.
	runtimeDepsHint = "install them with `make runtime-deps` (hack/install-runtime-deps.sh: apt-get install runc busybox-static)"
)

// A containerd node's files, under its node directory.
func (c *Cluster) containerdSocket(node string) string {
	return filepath.Join(c.NodeDir(node), "containerd.sock")
}

// ContainerdSocket is the CRI socket of a node with runtime containerd,
// e.g. for ctr or crictl.
func (c *Cluster) ContainerdSocket(node string) string { return c.containerdSocket(node) }

// ContainerdPID is the host PID of a containerd node's containerd, whose
// mount namespace (its private /var/lib/containerd, where snapshots are
// mounted) a ctr that runs containers must join: nsenter --target=PID --mount.
func (c *Cluster) ContainerdPID(node string) (int, error) {
	return c.namespacePID(containerdProcPrefix + node)
}

// SimDevRoot is where a containerd node's simulated GPUs have their device
// nodes (dev/nvidia<minor>, dev/nvidiactl) and driver directory (driver/);
// the plugin gets it as --sim-dev-root.
func (c *Cluster) SimDevRoot(node string) string { return filepath.Join(c.NodeDir(node), "gpu-host") }

// checkRuntimeDeps tells what a containerd node lacks on this machine.
func checkRuntimeDeps(containerdBinDir string) error {
	var errs []error
	for _, b := range ContainerdBinaries {
		if _, err := os.Stat(filepath.Join(containerdBinDir, b.Name)); err != nil {
			errs = append(errs, fmt.Errorf("containerd binaries (run `localcluster build`): %w", err))
			break
		}
	}
	if _, err := exec.LookPath(RuncBinary); err != nil {
		errs = append(errs, fmt.Errorf("runc: %w; %s", err, runtimeDepsHint))
	}
	if err := checkStatic(BusyboxBinary); err != nil {
		errs = append(errs, fmt.Errorf("busybox for the local images: %w; %s", err, runtimeDepsHint))
	}
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("containerd and runc need root (mounts, namespaces, device nodes, cgroups); run as root"))
	}
	return errors.Join(errs...)
}

// startContainerd starts the node's containerd in its own mount and PID
// namespace, with tmpfs over /var/lib, /var/log and /run there (its root
// and state, the network namespaces, the runc state), and imports the
// image tarballs (the local images first). It returns containerd's PID,
// whose namespaces the kubelet joins.
func (c *Cluster) startContainerd(ctx context.Context, n *nodeState, images []string) (int, error) {
	name := n.spec.Name
	dir := filepath.Join(c.NodeDir(name), "containerd")
	cniBin, cniConf := filepath.Join(dir, "cni-bin"), filepath.Join(dir, "cni-conf")
	for _, d := range []string{dir, cniBin, cniConf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 0, fmt.Errorf("create containerd directories of node %s: %w", name, err)
		}
	}
	if err := c.makeSimDevRoot(ctx, n.spec); err != nil {
		return 0, err
	}
	if err := writeCNI(cniBin, cniConf, n.podSubnet); err != nil {
		return 0, fmt.Errorf("write CNI plugin of node %s: %w", name, err)
	}
	runc, err := exec.LookPath(RuncBinary)
	if err != nil {
		return 0, fmt.Errorf("node %s: runc: %w; %s", name, err, runtimeDepsHint)
	}
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte(containerdConfig(c.containerdSocket(name), filepath.Join(c.NodeDir(name), "cdi"), cniBin, cniConf, runc)), 0o644); err != nil {
		return 0, fmt.Errorf("write containerd config of node %s: %w", name, err)
	}
	if err := c.shareMounts(); err != nil {
		return 0, err
	}
	// A slave of the host's mounts: what the host mounts under the
	// cluster directory later (the plugin's MPS tmpfs) reaches containerd
	// and so the containers, and nothing mounted here reaches the host.
	argv := []string{"unshare", "--mount", "--propagation", "slave", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
		"sh", "-c", `mount -t tmpfs -o size=512m tmpfs /var/lib && mount -t tmpfs -o size=64m tmpfs /var/log && mount -t tmpfs -o size=64m tmpfs /run && exec "$@"`, "sh",
		filepath.Join(c.cfg.ContainerdBinDir, "containerd"), "--config=" + config,
	}
	env := []string{"PATH=" + c.cfg.ContainerdBinDir + ":" + os.Getenv("PATH")}
	proc := containerdProcPrefix + name
	if err := c.launchOpts(proc, procOpts{workDir: dir, env: env}, argv...); err != nil {
		return 0, err
	}
	if err := c.waitSocket(ctx, proc, c.containerdSocket(name), time.Minute); err != nil {
		return 0, err
	}
	pid, err := c.namespacePID(proc)
	if err != nil {
		return 0, err
	}
	for _, img := range images {
		out, err := exec.CommandContext(ctx, filepath.Join(c.cfg.ContainerdBinDir, "ctr"), "--address", c.containerdSocket(name),
			"--namespace", "k8s.io", "images", "import", "--platform", "linux/amd64", img).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("import the images of %s into containerd of node %s: %w\n%s", img, name, err, out)
		}
	}
	return pid, nil
}

// sharedMountFile, in DIR/run, records that the cluster directory was
// bound onto itself as a shared mount, for Down to undo.
const sharedMountFile = "shared-mount"

// shareMounts binds the cluster directory onto itself as a shared mount,
// once, so that the containerd nodes' mount namespaces (slaves) receive
// what the host mounts under it afterwards, as on a real node whose / is
// shared (systemd): the kubelet plugin runs on the host and mounts each
// MPS daemon's tmpfs under its plugin directory, which share containers
// get through their CDI mounts. Down unmounts it.
func (c *Cluster) shareMounts() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	record := filepath.Join(c.dir, "run", sharedMountFile)
	if _, err := os.Stat(record); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(record), 0o755); err != nil {
		return err
	}
	if err := syscall.Mount(c.dir, c.dir, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the cluster directory %s onto itself for the containerd nodes: %w", c.dir, err)
	}
	if err := os.WriteFile(record, nil, 0o644); err != nil {
		_ = syscall.Unmount(c.dir, syscall.MNT_DETACH)
		return err
	}
	if err := syscall.Mount("", c.dir, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make the cluster directory %s a shared mount for the containerd nodes: %w", c.dir, err)
	}
	return nil
}

// unshareMounts undoes shareMounts, if it was done.
func unshareMounts(dir string) {
	record := filepath.Join(dir, "run", sharedMountFile)
	if _, err := os.Stat(record); err != nil {
		return
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err == nil || errors.Is(err, syscall.EINVAL) {
		os.Remove(record)
	}
}

// namespacePID is the PID of the child unshare forked: containerd, PID 1 of
// the node's PID namespace.
func (c *Cluster) namespacePID(proc string) (int, error) {
	p := c.procByName(proc)
	if p == nil {
		return 0, fmt.Errorf("%s is not running", proc)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.pid, p.pid))
	if err != nil {
		return 0, fmt.Errorf("find the process of %s: %w", proc, err)
	}
	f := strings.Fields(string(data))
	if len(f) != 1 {
		return 0, fmt.Errorf("find the process of %s: unshare (pid %d) has children %q, want one", proc, p.pid, f)
	}
	return strconv.Atoi(f[0])
}

func (c *Cluster) waitSocket(ctx context.Context, proc, socket string, timeout time.Duration) error {
	return c.poll(ctx, timeout, func() (bool, error) {
		conn, err := net.DialTimeout("unix", socket, time.Second)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	}, proc)
}

// containerdConfig is a containerd 2.x configuration: CRI with CDI specs
// from the plugin's directory, the local pause image as the sandbox image,
// runc from the host and the local CNI plugin.
func containerdConfig(socket, cdiDir, cniBin, cniConf, runc string) string {
	return fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = %[1]q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[6]q

[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = [%[2]q]
  # runc cannot lower a container's oom_score_adj below containerd's
  # without CAP_SYS_RESOURCE, which root lacks on some machines (sandboxes,
  # nested containers): "failed to update /proc/self/oom_score_adj:
  # Permission denied" for the pod sandbox's -998.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %[5]q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[3]q]
    conf_dir = %[4]q
    use_internal_loopback = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, socket, cdiDir, cniBin, cniConf, runc, ImagePause)
}

// cniPlugin gives a pod an eth0 with one address inside its own network
// namespace, one end of a veth pair whose other end stays there too (this
// kernel has no dummy interfaces): the CRI needs a pod IP, and nothing is connected to
// anything, on the host or outside.
const cniPlugin = `#!/bin/sh
# CNI plugin of the local cluster (written by test/cluster): eth0 with the
# next address of the node's subnet, a veth pair both of whose ends are in
# the pod's network namespace: nothing reaches the host or beyond.
set -eu
dir=$(dirname "$0")
case "$CNI_COMMAND" in
ADD)
  cat >/dev/null
  n=$(flock "$dir/ipam" sh -c 'n=$(cat "$1" 2>/dev/null || echo 1); n=$(( n %% 250 + 1 )); echo $n > "$1"; echo $n' sh "$dir/ipam")
  ip="%s.$(( n + 1 ))"
  nsenter --net="$CNI_NETNS" ip link add "$CNI_IFNAME" type veth peer name peer0
  nsenter --net="$CNI_NETNS" ip link set peer0 up
  nsenter --net="$CNI_NETNS" ip addr add "$ip/24" dev "$CNI_IFNAME"
  nsenter --net="$CNI_NETNS" ip link set "$CNI_IFNAME" up
  printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%%s","sandbox":"%%s"}],"ips":[{"address":"%%s/24","interface":0}]}\n' "$CNI_IFNAME" "$CNI_NETNS" "$ip"
  ;;
VERSION)
  echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}'
  ;;
*)
  cat >/dev/null || true
  ;;
esac
`

func writeCNI(binDir, confDir, subnet string) error {
	if err := os.WriteFile(filepath.Join(binDir, "gputopo-pod-net"), []byte(fmt.Sprintf(cniPlugin, subnet)), 0o755); err != nil {
		return err
	}
	conf := `{"cniVersion": "1.0.0", "name": "gputopo-local", "plugins": [{"type": "gputopo-pod-net"}]}` + "\n"
	return os.WriteFile(filepath.Join(confDir, "10-gputopo-local.conflist"), []byte(conf), 0o644)
}

// makeSimDevRoot creates what a GPU driver would on a host, for the
// node's simulated GPUs: character devices dev/nvidia<minor> (major 195,
// as NVIDIA's) for each GPU and dev/nvidiactl, and a driver/ directory.
// The GPUs are counted in the ResourceSlices the plugin would publish.
func (c *Cluster) makeSimDevRoot(ctx context.Context, n NodeSpec) error {
	root := c.SimDevRoot(n.Name)
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		return fmt.Errorf("create simulated device root of node %s: %w", n.Name, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "driver"), 0o755); err != nil {
		return fmt.Errorf("create simulated device root of node %s: %w", n.Name, err)
	}
	if err := os.WriteFile(filepath.Join(root, "driver", "version"), []byte("gputopo simulated driver, profile "+n.Profile+"\n"), 0o644); err != nil {
		return fmt.Errorf("create simulated device root of node %s: %w", n.Name, err)
	}
	gpus := 8
	if c.cfg.PluginBin != "" {
		out, err := exec.CommandContext(ctx, c.cfg.PluginBin, "--backend=sim", "--profile="+n.Profile, "--node-name="+n.Name, "--print-resource-slices").Output()
		if err != nil {
			return fmt.Errorf("count the simulated GPUs of node %s: %w", n.Name, err)
		}
		slices, err := ParseResourceSlices(out)
		if err != nil {
			return fmt.Errorf("count the simulated GPUs of node %s: %w", n.Name, err)
		}
		gpus = 0
		for _, s := range slices {
			gpus += len(s.Spec.Devices)
		}
	}
	nodes := map[string]int{"nvidiactl": 255}
	for i := range gpus {
		nodes["nvidia"+strconv.Itoa(i)] = i
	}
	for name, minor := range nodes {
		p := filepath.Join(root, "dev", name)
		os.Remove(p)
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, mkdev(195, minor)); err != nil {
			return fmt.Errorf("node %s: create the simulated GPU device %s (mknod c 195 %d needs root): %w", n.Name, p, minor, err)
		}
	}
	return nil
}

// mkdev encodes a device number as Linux does.
func mkdev(major, minor int) int {
	return (minor & 0xff) | (major&0xfff)<<8 | (minor&^0xff)<<12
}

// drainRuntime stops and removes every pod sandbox of a containerd node
// through the CRI, so that runc deletes the containers' cgroups; what
// remains dies with the node's PID namespace.
func drainRuntime(socket string, timeout time.Duration) {
	if _, err := os.Stat(socket); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addr, dialer, err := util.GetAddressAndDialer("unix://" + socket)
	if err != nil {
		return
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialer))
	if err != nil {
		return
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	for _, s := range list.Items {
		rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id})
		rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id})
	}
	// containerd puts pods without a cgroup parent under k8s.io in each
	// hierarchy; remove it once empty (rmdir fails while another node
	// still has pods there).
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, d := range dirs {
		syscall.Rmdir(d)
	}
}
