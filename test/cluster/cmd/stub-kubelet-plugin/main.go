// Command stub-kubelet-plugin stands in for gputopo-kubelet-plugin in the
// harness's own tests and before the real plugin exists. It accepts the real
// plugin's command line; it publishes four devices per node, prepares claims
// by returning CDI IDs (writing no CDI spec), and records prepared claims in
// <plugins dir>/gpu.gputopo.dev/checkpoint.json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

const driverName = "gpu.gputopo.dev"

func main() {
	var (
		profile     = flag.String("profile", "stub", "device profile")
		nodeName    = flag.String("node-name", "", "node name")
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig")
		registrar   = flag.String("kubelet-registrar-directory-path", "", "kubelet plugin registry")
		pluginsDir  = flag.String("kubelet-plugins-directory-path", "", "kubelet plugins dir")
		printSlices = flag.Bool("print-resource-slices", false, "print ResourceSlices as YAML and exit")
	)
	// Accepted and ignored: the stub has no metrics, health, CDI or backends.
	for _, f := range []string{"backend", "cdi-root", "metrics-address", "sim-health-file", "node-labels"} {
		flag.String(f, "", "ignored")
	}
	flag.Parse()
	if *nodeName == "" {
		fmt.Fprintln(os.Stderr, "--node-name is required")
		os.Exit(2)
	}
	if *printSlices {
		if err := printResourceSlices(*nodeName, *profile); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *nodeName, *profile, *kubeconfig, *registrar, *pluginsDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func devices(profile string) []resourceapi.Device {
	var out []resourceapi.Device
	for i := range 4 {
		out = append(out, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"profile": {StringValue: ptr.To(profile)},
				"index":   {IntValue: ptr.To(int64(i))},
			},
		})
	}
	return out
}

func printResourceSlices(node, profile string) error {
	s := resourceapi.ResourceSlice{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-" + driverName + "-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  devices(profile),
		},
	}
	data, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode ResourceSlice: %w", err)
	}
	fmt.Printf("---\n%s", data)
	return nil
}

func run(ctx context.Context, node, profile, kubeconfig, registrar, pluginsDir string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	dataDir := filepath.Join(pluginsDir, driverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("create plugin data dir: %w", err)
	}
	d := &driver{checkpoint: filepath.Join(dataDir, "checkpoint.json"), prepared: map[types.UID][]string{}}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(node),
		kubeletplugin.RegistrarDirectoryPath(registrar),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin helper: %w", err)
	}
	defer helper.Stop()
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices(profile)}}},
	}}
	if err := helper.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	klog.InfoS("stub plugin running", "node", node, "profile", profile)
	<-ctx.Done()
	return nil
}

type driver struct {
	mu         sync.Mutex
	checkpoint string
	prepared   map[types.UID][]string
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		var ids []string
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != driverName {
				continue
			}
			id := fmt.Sprintf("gputopo.dev/gpu=%s-%s", c.UID, r.Device)
			ids = append(ids, id)
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id},
			})
		}
		d.prepared[c.UID] = ids
		out[c.UID] = res
	}
	return out, d.save()
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		delete(d.prepared, c.UID)
		out[c.UID] = nil
	}
	return out, d.save()
}

func (d *driver) save() error {
	uids := make([]string, 0, len(d.prepared))
	for uid := range d.prepared {
		uids = append(uids, string(uid))
	}
	sort.Strings(uids)
	data, err := json.Marshal(map[string]any{"preparedClaims": uids})
	if err != nil {
		return err
	}
	tmp := d.checkpoint + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return os.Rename(tmp, d.checkpoint)
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		os.Exit(1)
	}
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
