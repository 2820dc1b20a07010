package kubeletplugin

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

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

// readmeFlagDefaults reads the flag table under heading in README.md: for
// each row whose default cell holds only literal values, one per flag of
// the row, the flag's documented default. Rows whose default is prose
// ("in-cluster", "same as `--nvidia-driver-root`") or names another flag
// or variable are left out.
func readmeFlagDefaults(t *testing.T, heading string) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q", heading)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	tick := regexp.MustCompile("`([^`]*)`")
	defaults := map[string]string{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`-") {
			continue
		}
		var flags []string
		for _, m := range tick.FindAllStringSubmatch(cells[1], -1) {
			flags = append(flags, strings.TrimLeft(m[1], "-"))
		}
		values := tick.FindAllStringSubmatch(cells[2], -1)
		if rest := strings.Trim(tick.ReplaceAllString(cells[2], ""), ", "); rest != "" || len(values) != len(flags) {
			continue
		}
		for i, m := range values {
			if v := m[1]; !strings.HasPrefix(v, "$") && !strings.HasPrefix(v, "--") {
				defaults[flags[i]] = v
			}
		}
	}
	return defaults
}

// The defaults the README's table of the plugin's flags gives as values
// are the flags' defaults.
func TestReadmeGivesThePluginFlagDefaults(t *testing.T) {
	defaults := readmeFlagDefaults(t, "### `gputopo-kubelet-plugin` flags")
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
		got := f.DefValue
		switch f.Value.Type() {
		case "duration":
			d, err := time.ParseDuration(documented)
			if err != nil {
				t.Errorf("--%s: documented default %q is not a duration", name, documented)
				continue
			}
			documented = d.String()
		case "uintSlice", "stringSlice", "intSlice":
			got = strings.Trim(got, "[]")
		}
		t.Logf("--%s: README %q, flag %q", name, documented, got)
		if got != documented {
			t.Errorf("README.md says --%s defaults to %q; it defaults to %q", name, documented, f.DefValue)
		}
	}
	if checked < 10 {
		t.Errorf("only %d documented defaults compared; the table's format may have changed", checked)
	}
}
