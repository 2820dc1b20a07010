package kubeletplugin

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/internal/readmetest"
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

// The defaults the README's table of the plugin's flags gives as values
// are the flags' defaults.
func TestReadmeGivesThePluginFlagDefaults(t *testing.T) {
	defaults, _, err := readmetest.FlagTable("../../README.md", "### `gputopo-kubelet-plugin` flags")
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("plugin", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	checked := 0
	for name, documented := range defaults {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("README.md documents --%s, which the plugin does not have", name)
			continue
		}
		checked++
		t.Logf("--%s: README %q, flag %q", name, documented, f.DefValue)
		if same, err := readmetest.SameDefault(f, documented); err != nil {
			t.Error(err)
		} else if !same {
			t.Errorf("README.md says --%s defaults to %q; it defaults to %q", name, documented, f.DefValue)
		}
	}
	if checked < 10 {
		t.Errorf("only %d documented defaults compared; the table's format may have changed", checked)
	}
}
