package kubeletplugin

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

// The README's reference documents every flag of the plugin, and the
// taints, taint values and node labels it introduces, each in a table row.
func TestReadmeDocumentsThePlugin(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "|") {
			rows = append(rows, line)
		}
	}
	inRow := func(s string) bool {
		for _, r := range rows {
			if strings.Contains(r, "`"+s+"`") {
				return true
			}
		}
		return false
	}
	fs := pflag.NewFlagSet("plugin", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if !inRow("--" + f.Name) {
			t.Errorf("README.md has no table row for the plugin flag --%s", f.Name)
		}
	})
	for _, name := range []string{
		topology.TaintUnmonitored, UnmonitoredWatchFailing,
		gpu.FabricNotStarted, gpu.FabricInProgress, gpu.FabricFailed,
		topology.LabelNVIDIAGPUPresent, topology.LabelNFDNVIDIAPCI,
	} {
		if !inRow(name) {
			t.Errorf("README.md has no reference table row for %s", name)
		}
	}
}
