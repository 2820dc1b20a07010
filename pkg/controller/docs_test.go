package controller

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/internal/readmetest"
	"github.com/gputopo/gputopo/pkg/topology"
)

// The README's table of the controller's flags has a row for every flag,
// and the defaults it gives as values are the flags' defaults.
func TestReadmeDocumentsTheControllerFlags(t *testing.T) {
	defaults, rows, err := readmetest.FlagTable("../../README.md", "### `gputopo-controller` flags")
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("gputopo-controller", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	checked := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if !rows[f.Name] {
			t.Errorf("README.md's controller flag table has no row for --%s", f.Name)
		}
		documented, ok := defaults[f.Name]
		if !ok {
			return
		}
		checked++
		t.Logf("--%s: README %q, flag %q", f.Name, documented, f.DefValue)
		if same, err := readmetest.SameDefault(f, documented); err != nil {
			t.Error(err)
		} else if !same {
			t.Errorf("README.md says --%s defaults to %q; it defaults to %q", f.Name, documented, f.DefValue)
		}
	})
	for name := range rows {
		if fs.Lookup(name) == nil {
			t.Errorf("README.md's controller flag table has a row for --%s, which the controller does not have", name)
		}
	}
	if checked < 12 {
		t.Errorf("only %d documented defaults compared; the table's format may have changed", checked)
	}
}

// The names the controller puts on objects of others' (DeviceTaintRules
// it writes, slices in its cache, the ConfigMap of claims' node
// selectors) are rows of the README's reference.
func TestReadmeDocumentsTheControllerNames(t *testing.T) {
	rows, err := readmetest.ReferenceNames("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{topology.LabelFence, topology.AnnotationFenceReason, topology.AnnotationPackedAttributes, topology.LabelClaimNodeSelectors} {
		if !rows[name] {
			t.Errorf("README.md has no reference table row for %s", name)
		}
	}
}
