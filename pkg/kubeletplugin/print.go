package kubeletplugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// PrintResourceSlices writes the ResourceSlices a node would publish as a
// YAML stream, the way `--print-resource-slices` shows them.
func PrintResourceSlices(w io.Writer, inv *gpu.Inventory, node slices.Node, cfg slices.Config) error {
	res, err := slices.Build(inv, node, cfg, nil)
	if err != nil {
		return fmt.Errorf("build ResourceSlices for node %s: %w", node.Name, err)
	}
	for i, s := range slices.Objects(node.Name, res) {
		data, err := yaml.Marshal(s)
		if err != nil {
			return fmt.Errorf("encode ResourceSlice %s: %w", s.Name, err)
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return nil
}

// PrintCDISpec prepares a one-GPU claim for device the way the plugin
// prepares claims, in a scratch directory, and writes the CDI spec it got:
// what `--print-cdi-spec` shows, so the spec of a real node can be checked
// without a cluster. Nothing outside the scratch directory is changed.
func PrintCDISpec(ctx context.Context, w io.Writer, cfg Config, labels map[string]string, device string) error {
	dir, err := os.MkdirTemp("", "gputopo-cdi-")
	if err != nil {
		return fmt.Errorf("create scratch directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	cfg.CDIRoot, cfg.PluginDir, cfg.BootID = filepath.Join(dir, "cdi"), filepath.Join(dir, "plugin"), ""
	d, err := New(ctx, cfg, labels, nil)
	if err != nil {
		return err
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "print-cdi-spec", UID: "00000000-0000-4000-8000-000000000000"}}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: topology.DriverName, Pool: cfg.NodeName, Device: device}},
	}}
	if r := d.state.prepare(ctx, claim, d.view()); r.Err != nil {
		return r.Err
	}
	data, err := os.ReadFile(d.state.cdi.SpecPath(string(claim.UID)))
	if err != nil {
		return fmt.Errorf("read the CDI spec of %s: %w", device, err)
	}
	_, err = w.Write(append(data, '\n'))
	return err
}
