package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrNotRunning is returned when a process that should be stopped is not running.
var ErrNotRunning = errors.New("not running")

const stopTimeout = 15 * time.Second

// registeredLine is what a line of the kubelet's log holds (at
// --vmodule=dra_plugin_manager=3) once it has registered the gputopo plugin.
// Its plugin manager does that on its next reconcile (every second) after
// the registration socket appears; a pod whose claims the kubelet tries to
// prepare before that fails, and the kubelet retries it only after a long
// backoff (over a minute observed), so a started plugin counts only once its
// kubelet has logged this.
var registeredLine = []string{`"Registered DRA plugin"`, `driverName="` + DriverName + `"`}

// ReadyInfo is the content of DIR/ready, written once the cluster is usable.
// PIDs are those at start; DIR/run/NAME.pid always has the current ones.
type ReadyInfo struct {
	Dir            string         `json:"dir"`
	Kubeconfig     string         `json:"kubeconfig"`
	Server         string         `json:"server"`
	SupervisorPID  int            `json:"supervisorPID"`
	PIDs           map[string]int `json:"pids"`
	Ports          Ports          `json:"ports"`
	Nodes          []NodeInfo     `json:"nodes"`
	BinDir         string         `json:"binDir"`
	PluginBin      string         `json:"pluginBin,omitempty"`
	PluginArgs     []string       `json:"pluginArgs,omitempty"`
	NoPluginNodes  []string       `json:"noPluginNodes,omitempty"`
	Images         []string       `json:"images,omitempty"`
	ControllerBin  string         `json:"controllerBin,omitempty"`
	ControllerArgs []string       `json:"controllerArgs,omitempty"`
	StartSeconds   float64        `json:"startSeconds"`
}

func (c *Cluster) writeReady() error {
	info := ReadyInfo{
		Dir: c.dir, Kubeconfig: c.Kubeconfig(), Server: c.server, SupervisorPID: os.Getpid(),
		PIDs: map[string]int{}, Ports: c.ports, Nodes: c.Nodes(), BinDir: c.cfg.BinDir,
		PluginBin: c.cfg.PluginBin, PluginArgs: c.cfg.PluginArgs, NoPluginNodes: c.cfg.NoPluginNodes, Images: c.cfg.Images,
		ControllerBin: c.cfg.ControllerBin, ControllerArgs: c.cfg.ControllerArgs,
		StartSeconds: time.Since(c.started).Seconds(),
	}
	c.mu.Lock()
	for name, p := range c.procs {
		info.PIDs[name] = p.pid
	}
	c.mu.Unlock()
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("encode ready file: %w", err)
	}
	tmp := filepath.Join(c.dir, ".ready.tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write ready file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "ready")); err != nil {
		return fmt.Errorf("write ready file: %w", err)
	}
	return nil
}

// ReadReady reads DIR/ready.
func ReadReady(dir string) (*ReadyInfo, error) {
	data, err := os.ReadFile(filepath.Join(dir, "ready"))
	if err != nil {
		return nil, fmt.Errorf("read ready file of cluster %s: %w", dir, err)
	}
	var info ReadyInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("decode ready file of cluster %s: %w", dir, err)
	}
	return &info, nil
}

// RunningPID returns the pid of the live process that started the cluster
// in dir, or 0.
func RunningPID(dir string) int {
	if p := procFromPidFile(filepath.Join(dir, "run", "supervisor")); p != nil {
		return p.pid
	}
	return 0
}

// Attach returns a Cluster for the one running in dir (from `localcluster up`).
// It can drive plugins and read records but does not own the processes.
func Attach(dir string) (*Cluster, error) {
	info, err := ReadReady(dir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		cfg: Config{Dir: info.Dir, BinDir: info.BinDir, PluginBin: info.PluginBin, PluginArgs: info.PluginArgs,
			NoPluginNodes: info.NoPluginNodes, Images: info.Images,
			ControllerBin: info.ControllerBin, ControllerArgs: info.ControllerArgs, Progress: os.Stderr},
		dir: info.Dir, ports: info.Ports, server: info.Server, started: time.Now(),
		procs: map[string]*proc{}, nodes: map[string]*nodeState{},
	}
	for _, n := range info.Nodes {
		c.nodes[n.Name] = &nodeState{spec: n.NodeSpec, kubeletPort: n.KubeletPort, healthzPort: n.HealthzPort, metricsPort: n.MetricsPort}
		c.order = append(c.order, n.Name)
	}
	if err := c.connect(); err != nil {
		return nil, err
	}
	return c, nil
}

// writeSupervisorPID records this process as the one that owns the cluster.
func (c *Cluster) writeSupervisorPID() error {
	start, err := procStartTime(os.Getpid())
	if err != nil {
		return fmt.Errorf("read own start time: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(c.dir, "run"), 0o755); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "run", "supervisor"), []byte(fmt.Sprintf("%d %d\n", os.Getpid(), start)), 0o644); err != nil {
		return fmt.Errorf("write supervisor pid: %w", err)
	}
	return nil
}

func (c *Cluster) waitNodes(ctx context.Context) error {
	var watch []string
	for _, name := range c.order {
		if c.nodes[name].spec.Real {
			watch = append(watch, "kubelet-"+name)
		}
	}
	var pending []string
	err := c.poll(ctx, 2*time.Minute, func() (bool, error) {
		list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := map[string]bool{}
		for i := range list.Items {
			ready[list.Items[i].Name] = nodeUsable(&list.Items[i])
		}
		pending = pending[:0]
		for _, name := range c.order {
			if !ready[name] {
				pending = append(pending, name)
			}
		}
		return len(pending) == 0, nil
	}, watch...)
	if err != nil {
		return fmt.Errorf("wait for nodes to be Ready%s: %w", stillWaiting(pending), err)
	}
	c.progress("%d nodes Ready", len(c.order))
	if c.cfg.PluginBin == "" {
		return nil
	}
	watch = watch[:0]
	for _, name := range c.order {
		if c.nodes[name].spec.Real && c.runsPlugin(name) {
			watch = append(watch, "plugin-"+name, "kubelet-"+name)
		}
	}
	err = c.poll(ctx, 2*time.Minute, func() (bool, error) {
		slices, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		has := map[string]bool{}
		for _, s := range slices.Items {
			if s.Spec.NodeName != nil {
				has[*s.Spec.NodeName] = true
			}
		}
		pending = pending[:0]
		for _, name := range c.order {
			if !has[name] && (!c.nodes[name].spec.Real || c.runsPlugin(name)) {
				pending = append(pending, name)
			}
		}
		return len(pending) == 0, nil
	}, watch...)
	if err != nil {
		return fmt.Errorf("wait for ResourceSlices%s: %w", stillWaiting(pending), err)
	}
	for _, name := range c.order {
		if c.nodes[name].spec.Real && c.runsPlugin(name) {
			if err := c.waitPluginSockets(ctx, name); err != nil {
				return fmt.Errorf("wait for the plugin of %s to listen: %w", name, err)
			}
			// The kubelet's log is new with the cluster: any registration counts.
			if err := c.waitPluginRegistered(ctx, name, 0); err != nil {
				return err
			}
		}
	}
	c.progress("every node has ResourceSlices; plugins listen and are registered")
	return nil
}

func stillWaiting(nodes []string) string {
	if len(nodes) == 0 {
		return ""
	}
	return " (still waiting for " + strings.Join(nodes, ", ") + ")"
}

// nodeUsable: Ready and without the taints that keep pods away.
func nodeUsable(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// StartPlugin starts the gputopo plugin of a real node.
func (c *Cluster) StartPlugin(node string) error {
	if _, err := c.realNode(node); err != nil {
		return err
	}
	if !c.runsPlugin(node) {
		return fmt.Errorf("start plugin of %s: the cluster runs no plugin there (no plugin binary, or NoPluginNodes)", node)
	}
	if p := c.procByName("plugin-" + node); p != nil {
		if !p.exited() {
			return fmt.Errorf("start plugin of %s: already running as pid %d", node, p.pid)
		}
	}
	var logged int64
	if fi, err := os.Stat(c.logPath("kubelet-" + node)); err == nil {
		logged = fi.Size()
	}
	if err := c.launchPlugin(node); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.waitPluginSockets(ctx, node); err != nil {
		return fmt.Errorf("start plugin of %s: %w", node, err)
	}
	return c.waitPluginRegistered(ctx, node, logged)
}

// waitPluginRegistered waits until the kubelet of node has logged, after
// offset bytes of its log, that it registered the plugin.
func (c *Cluster) waitPluginRegistered(ctx context.Context, node string, offset int64) error {
	logPath := c.logPath("kubelet-" + node)
	err := c.poll(ctx, time.Minute, func() (bool, error) {
		return logHasLineSince(logPath, offset, registeredLine...), nil
	}, "kubelet-"+node, "plugin-"+node)
	if err != nil {
		return fmt.Errorf("wait for the kubelet of %s to register its plugin: %w", node, err)
	}
	return nil
}

// logHasLineSince reports whether a line of the file at path, after its
// first offset bytes, holds every one of parts.
func logHasLineSince(path string, offset int64, parts ...string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

func (c *Cluster) launchPlugin(node string) error {
	argv := append([]string{c.cfg.PluginBin}, c.pluginArgs(c.nodes[node].spec)...)
	return c.launchOpts("plugin-"+node, procOpts{workDir: c.NodeDir(node)}, argv...)
}

// waitPluginSockets waits until the plugin accepts connections on a
// registration socket (<root>/plugins_registry/gpu.gputopo.dev*) and a DRA
// socket (<root>/plugins/gpu.gputopo.dev/*). A socket left by a killed
// plugin refuses connections, so it does not count.
func (c *Cluster) waitPluginSockets(ctx context.Context, node string) error {
	root := c.kubeletRoot(node)
	patterns := []string{
		filepath.Join(root, "plugins_registry", DriverName+"*"),
		filepath.Join(root, "plugins", DriverName, "*"),
	}
	return c.poll(ctx, time.Minute, func() (bool, error) {
		for _, pattern := range patterns {
			if !anySocketAccepts(pattern) {
				return false, nil
			}
		}
		return true, nil
	}, "plugin-"+node, "kubelet-"+node)
}

func anySocketAccepts(pattern string) bool {
	files, _ := filepath.Glob(pattern)
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.Mode()&os.ModeSocket == 0 {
			continue
		}
		if conn, err := net.DialTimeout("unix", f, time.Second); err == nil {
			conn.Close()
			return true
		}
	}
	return false
}

// StopPlugin stops a node's plugin with SIGTERM (SIGKILL after a timeout).
func (c *Cluster) StopPlugin(node string) error {
	p, err := c.runningPlugin(node)
	if err != nil {
		return err
	}
	p.stop(stopTimeout)
	return nil
}

// KillPlugin kills a node's plugin with SIGKILL, as a crash would.
func (c *Cluster) KillPlugin(node string) error {
	p, err := c.runningPlugin(node)
	if err != nil {
		return err
	}
	p.kill(stopTimeout)
	return nil
}

// RestartPlugin stops a node's plugin gracefully, if it runs, and starts it again.
func (c *Cluster) RestartPlugin(node string) error {
	if err := c.StopPlugin(node); err != nil && !errors.Is(err, ErrNotRunning) {
		return err
	}
	return c.StartPlugin(node)
}

func (c *Cluster) runningPlugin(node string) (*proc, error) {
	if _, err := c.realNode(node); err != nil {
		return nil, err
	}
	p := c.procByName("plugin-" + node)
	if p == nil || p.exited() {
		return nil, fmt.Errorf("plugin of %s: %w", node, ErrNotRunning)
	}
	return p, nil
}

// Stop stops every process of the cluster, plugins and kubelets first, etcd
// last, and leaves DIR with its logs. A Cluster from Attach stops the whole
// cluster like Down. Safe to call more than once.
func (c *Cluster) Stop() {
	if !c.owner {
		Down(c.dir)
		return
	}
	c.mu.Lock()
	procs := make([]*proc, 0, len(c.procs))
	for _, p := range c.procs {
		procs = append(procs, p)
	}
	c.mu.Unlock()
	// Plugins started by an attached Cluster are known only by pid file.
	stopInOrder(append(procs, pidFileProcs(c.dir, procs)...))
	for _, n := range c.nodes {
		if n.cri != nil {
			n.cri.Stop()
		}
	}
	unmountUnder(c.dir)
	unshareMounts(c.dir)
	removeCPUGroups(c.dir)
	os.Remove(filepath.Join(c.dir, "ready"))
	os.Remove(filepath.Join(c.dir, "run", "supervisor"))
}

// Down stops the cluster in dir: it asks the process that started it to stop
// everything, then stops by pid file whatever is left. Idempotent.
func Down(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolve cluster dir: %w", err)
	}
	if sup := procFromPidFile(filepath.Join(dir, "run", "supervisor")); sup != nil && sup.pid != os.Getpid() {
		// Only the pid: the supervisor may share a process group with a shell.
		syscall.Kill(sup.pid, syscall.SIGTERM)
		if !sup.wait(time.Minute) {
			syscall.Kill(sup.pid, syscall.SIGKILL)
			sup.wait(10 * time.Second)
		}
	}
	stopInOrder(pidFileProcs(dir, nil))
	unmountUnder(dir)
	unshareMounts(dir)
	removeCPUGroups(dir)
	os.Remove(filepath.Join(dir, "ready"))
	os.Remove(filepath.Join(dir, "run", "supervisor"))
	return nil
}

// pidFileProcs returns the live processes named by DIR/run/*.pid, except
// those in known; it removes stale pid files.
func pidFileProcs(dir string, known []*proc) []*proc {
	files, _ := filepath.Glob(filepath.Join(dir, "run", "*.pid"))
	var procs []*proc
	for _, f := range files {
		p := procFromPidFile(f)
		switch {
		case p == nil:
			os.Remove(f)
		case !slices.ContainsFunc(known, func(k *proc) bool { return k.pid == p.pid }):
			procs = append(procs, p)
		}
	}
	return procs
}

// stopInOrder stops plugins, kubelets and peers, then containerd (after removing
// its pods), then the scheduler, controller manager and apiserver, then
// etcd; each group in parallel.
func stopInOrder(procs []*proc) {
	rank := func(name string) int {
		switch {
		case strings.HasPrefix(name, "plugin-"), strings.HasPrefix(name, "kubelet-"), strings.HasPrefix(name, "peer-"):
			return 0
		case strings.HasPrefix(name, containerdProcPrefix):
			return 1
		case name == "etcd":
			return 3
		default:
			return 2
		}
	}
	sort.Slice(procs, func(i, j int) bool { return rank(procs[i].name) < rank(procs[j].name) })
	for i := 0; i < len(procs); {
		j := i
		var wg sync.WaitGroup
		for ; j < len(procs) && rank(procs[j].name) == rank(procs[i].name); j++ {
			p := procs[j]
			wg.Go(func() {
				if node, ok := strings.CutPrefix(p.name, containerdProcPrefix); ok {
					// DIR/run/NAME.pid: the node's socket is under DIR/nodes.
					dir := filepath.Dir(filepath.Dir(p.pidFile))
					drainRuntime(filepath.Join(dir, "nodes", node, "containerd.sock"), 30*time.Second)
				}
				p.stop(stopTimeout)
			})
		}
		wg.Wait()
		i = j
	}
}

// unmountUnder lazily unmounts anything mounted under dir in this mount
// namespace. The kubelets' tmpfs mounts live in their own namespaces and
// vanish with them; this catches anything else.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		if strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, mp := range mounts {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}

func unescapeMountPath(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// Watch reports processes that exit until ctx ends.
func (c *Cluster) Watch(ctx context.Context) {
	seen := map[*proc]bool{}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		for name, p := range c.procs {
			if !seen[p] && p.exited() {
				seen[p] = true
				c.progress("%s (pid %d) exited: %v; log: %s", name, p.pid, p.exitErr(), p.logFile)
			}
		}
		c.mu.Unlock()
	}
}
