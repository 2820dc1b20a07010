package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// DriverName is the gputopo DRA driver's name.
const DriverName = "gpu.gputopo.dev"

// nodeState is what the harness keeps per node.
type nodeState struct {
	spec        NodeSpec
	kubeletPort int
	healthzPort int
	metricsPort int
	cri         *FakeCRI
	// podSubnet is the first three octets of a containerd node's pod IPs.
	podSubnet string
}

// NodeInfo describes a node in the ready file.
type NodeInfo struct {
	NodeSpec
	KubeletPort int `json:"kubeletPort,omitempty"`
	HealthzPort int `json:"healthzPort,omitempty"`
	MetricsPort int `json:"metricsPort,omitempty"`
}

func (n *nodeState) info() NodeInfo {
	return NodeInfo{NodeSpec: n.spec, KubeletPort: n.kubeletPort, HealthzPort: n.healthzPort, MetricsPort: n.metricsPort}
}

func (c *Cluster) startRealNode(ctx context.Context, n *nodeState) error {
	name := n.spec.Name
	nodeDir := c.NodeDir(name)
	root := c.kubeletRoot(name)
	workDir := filepath.Join(nodeDir, "cwd") // empty: see LOCAL-CLUSTER.md on log cleanup
	// The plugin may start before the kubelet has made its directories.
	dirs := []string{root, filepath.Join(root, "pki"), filepath.Join(root, "plugins_registry"),
		filepath.Join(root, "plugins"), workDir, filepath.Join(nodeDir, "cdi")}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create directories of node %s: %w", name, err)
		}
	}
	kubeconfig := filepath.Join(nodeDir, "kubelet.kubeconfig")
	if err := c.pki.IssueKubeconfig(kubeconfig, c.server, "system:node:"+name, "system:nodes"); err != nil {
		return fmt.Errorf("issue kubelet credentials of node %s: %w", name, err)
	}
	// The kubelet writes /var/lib/kubelet/device-plugins and /var/log/containers
	// whatever --root-dir says: give it a private mount namespace with tmpfs
	// over both, so kubelets do not clash and nothing reaches the host. The
	// mounts vanish with the namespace when the kubelet exits.
	argv := []string{"unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount -t tmpfs -o size=64m tmpfs /var/lib && mount -t tmpfs -o size=64m tmpfs /var/log && exec "$@"`, "sh"}
	socket := filepath.Join(nodeDir, "cri.sock")
	if n.spec.Runtime == RuntimeContainerd {
		pid, err := c.startContainerd(ctx, n, append([]string{c.imagesPath()}, c.cfg.Images...))
		if err != nil {
			return err
		}
		socket = c.containerdSocket(name)
		// containerd's namespaces: the kubelet's mounts (volumes, tokens)
		// must be those containerd gives containers, and /proc there is
		// that PID namespace's.
		argv = []string{"nsenter", "--target=" + strconv.Itoa(pid), "--mount", "--pid", "--"}
	} else {
		cri, err := StartFakeCRI(socket, c.recordFile(name))
		if err != nil {
			return fmt.Errorf("start fake CRI of node %s: %w", name, err)
		}
		n.cri = cri
	}
	config := filepath.Join(nodeDir, "kubelet-config.yaml")
	if err := writeKubeletConfig(config, root, socket, c.pki.CA.CertFile, n.kubeletPort, n.healthzPort, c.cfg.FeatureGates, n.spec.Runtime); err != nil {
		return fmt.Errorf("write kubelet config of node %s: %w", name, err)
	}
	argv = append(argv,
		c.bin("kubelet"),
		"--config="+config,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+root,
		"--cert-dir="+filepath.Join(root, "pki"),
		"--hostname-override="+name,
		// Logs "Registered DRA plugin", which StartPlugin waits for.
		"--vmodule=dra_plugin_manager=3",
		"--node-labels="+LabelString(n.spec.AllLabels()),
	)
	if err := c.launchOpts("kubelet-"+name, procOpts{workDir: workDir}, argv...); err != nil {
		return err
	}
	if c.runsPlugin(name) {
		return c.launchPlugin(name) // waitNodes waits for it
	}
	return nil
}

func writeKubeletConfig(path, root, socket, clientCA string, port, healthzPort int, gates map[string]bool, runtime string) error {
	// A map, not the typed struct: enforceNodeAllocatable and evictionHard
	// must be written empty, which omitempty would drop.
	cfg := map[string]any{
		"apiVersion":                    "kubelet.config.k8s.io/v1beta1",
		"kind":                          "KubeletConfiguration",
		"address":                       "127.0.0.1",
		"port":                          port,
		"readOnlyPort":                  0,
		"healthzBindAddress":            "127.0.0.1",
		"healthzPort":                   healthzPort,
		"containerRuntimeEndpoint":      "unix://" + socket,
		"failCgroupV1":                  false,
		"cgroupDriver":                  "cgroupfs",
		"cgroupsPerQOS":                 false,
		"enforceNodeAllocatable":        []string{},
		"failSwapOn":                    false,
		"makeIPTablesUtilChains":        false,
		"localStorageCapacityIsolation": false,
		"evictionHard":                  map[string]string{},
		"podLogsDir":                    filepath.Join(root, "pod-logs"),
		"volumePluginDir":               filepath.Join(root, "volume-plugins"),
		"featureGates":                  gates,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": clientCA},
		},
		"authorization": map[string]any{"mode": "AlwaysAllow"},
	}
	if runtime == RuntimeContainerd {
		cfg["registerWithTaints"] = []map[string]string{{"key": TaintRuntime, "value": runtime, "effect": "NoSchedule"}}
		// The local images cannot be pulled again: never collect them.
		cfg["imageGCHighThresholdPercent"] = 100
		cfg["imageGCLowThresholdPercent"] = 99
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func (c *Cluster) pluginArgs(n NodeSpec) []string {
	nodeDir, root := c.NodeDir(n.Name), c.kubeletRoot(n.Name)
	ns := c.nodes[n.Name]
	args := []string{
		"--backend=sim",
		"--profile=" + n.Profile,
		"--node-name=" + n.Name,
		"--kubeconfig=" + c.Kubeconfig(),
		"--kubelet-registrar-directory-path=" + filepath.Join(root, "plugins_registry"),
		"--kubelet-plugins-directory-path=" + filepath.Join(root, "plugins"),
		"--cdi-root=" + filepath.Join(nodeDir, "cdi"),
		"--metrics-address=127.0.0.1:" + strconv.Itoa(ns.metricsPort),
		"--sim-health-file=" + filepath.Join(nodeDir, "unhealthy"),
	}
	if n.Runtime == RuntimeContainerd {
		args = append(args, "--sim-dev-root="+c.SimDevRoot(n.Name))
	}
	return append(args, c.cfg.PluginArgs...)
}

func (c *Cluster) createFakeNode(ctx context.Context, n NodeSpec) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.AllLabels()}}
	if _, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create fake node %s: %w", n.Name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("128"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	now := metav1.Now()
	status := corev1.NodeStatus{
		Capacity:    res,
		Allocatable: res,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "FakeNode",
			Message: "fake node without a kubelet", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: c.KubernetesVersion(), OperatingSystem: "linux", Architecture: "amd64"},
	}
	// A patch, not an update: the node controllers change the new Node at once.
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return fmt.Errorf("encode status of fake node %s: %w", n.Name, err)
	}
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("set status of fake node %s: %w", n.Name, err)
	}
	if c.cfg.PluginBin == "" {
		return nil
	}
	return c.publishFakeNodeSlices(ctx, n)
}

// RestoreFakeNode creates a fake node's Node object again after a test
// deleted it, Ready, with its ResourceSlices. Deleting a fake Node leaves its
// slices behind (they have no owner reference to the Node, unlike the ones
// the kubelet plugin publishes); those are kept and the missing ones created.
func (c *Cluster) RestoreFakeNode(ctx context.Context, name string) error {
	n := c.nodes[name]
	if n == nil || n.spec.Real {
		return fmt.Errorf("restore node %s: not a fake node of this cluster", name)
	}
	return c.createFakeNode(ctx, n.spec)
}

// publishFakeNodeSlices asks the plugin which ResourceSlices the node would
// have and creates them.
func (c *Cluster) publishFakeNodeSlices(ctx context.Context, n NodeSpec) error {
	args := []string{"--backend=sim", "--profile=" + n.Profile, "--node-name=" + n.Name,
		"--node-labels=" + LabelString(n.AllLabels()), "--print-resource-slices"}
	logPath := c.logPath("plugin-" + n.Name)
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open plugin log of fake node %s: %w", n.Name, err)
	}
	defer log.Close()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, c.cfg.PluginBin, args...)
	cmd.Stdout, cmd.Stderr = &out, log
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return &StartError{Proc: "plugin-" + n.Name, Log: logPath, Err: fmt.Errorf("print ResourceSlices of fake node %s: %w", n.Name, err)}
	}
	slices, err := ParseResourceSlices(out.Bytes())
	if err != nil {
		return fmt.Errorf("parse ResourceSlices of fake node %s: %w", n.Name, err)
	}
	if len(slices) == 0 {
		return fmt.Errorf("plugin printed no ResourceSlice for fake node %s", n.Name)
	}
	for _, s := range slices {
		if s.Name == "" && s.GenerateName == "" {
			s.GenerateName = n.Name + "-" + s.Spec.Driver + "-"
		}
		if _, err := c.client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ResourceSlice for fake node %s: %w", n.Name, err)
		}
	}
	return nil
}

// ParseResourceSlices decodes a stream of resource.k8s.io/v1 ResourceSlice
// documents in YAML (separated by ---) or JSON.
func ParseResourceSlices(data []byte) ([]*resourcev1.ResourceSlice, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var slices []*resourcev1.ResourceSlice
	for i := 0; ; i++ {
		var s resourcev1.ResourceSlice
		err := dec.Decode(&s)
		if errors.Is(err, io.EOF) {
			return slices, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if s.Kind == "" && s.APIVersion == "" && s.Spec.Driver == "" {
			continue // empty document
		}
		if s.Kind != "ResourceSlice" || s.APIVersion != resourcev1.SchemeGroupVersion.String() {
			return nil, fmt.Errorf("document %d: want %s ResourceSlice, got %s %s", i, resourcev1.SchemeGroupVersion, s.APIVersion, s.Kind)
		}
		slices = append(slices, &s)
	}
}
