package kubeletplugin

import (
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/slices"
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
