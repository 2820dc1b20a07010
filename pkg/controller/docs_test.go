package controller

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// readmeFlagDefaults reads the flag table under heading in README.md: for
// each row whose default cell holds only literal values, one per flag of
// the row, the flag's documented default. Rows whose default is prose
// ("in-cluster", "`$POD_NAMESPACE` or `kube-system`") or names another flag
// or variable are left out; every flag named in the table is in rows.
func readmeFlagDefaults(t *testing.T, heading string) (defaults map[string]string, rows map[string]bool) {
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
	defaults, rows = map[string]string{}, map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`-") {
			continue
		}
		var flags []string
		for _, m := range tick.FindAllStringSubmatch(cells[1], -1) {
			flags = append(flags, strings.TrimLeft(m[1], "-"))
			rows[strings.TrimLeft(m[1], "-")] = true
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
	return defaults, rows
}

// sameDefault compares a documented default with the flag's.
func sameDefault(t *testing.T, f *pflag.Flag, documented string) bool {
	t.Helper()
	switch f.Value.Type() {
	case "duration":
		d, err := time.ParseDuration(documented)
		if err != nil {
			t.Errorf("--%s: documented default %q is not a duration", f.Name, documented)
			return true
		}
		return d.String() == f.DefValue
	case "uintSlice", "stringSlice", "intSlice":
		return strings.Trim(f.DefValue, "[]") == documented
	}
	return f.DefValue == documented
}

// The README's table of the controller's flags has a row for every flag,
// and the defaults it gives as values are the flags' defaults.
func TestReadmeDocumentsTheControllerFlags(t *testing.T) {
	defaults, rows := readmeFlagDefaults(t, "### `gputopo-controller` flags")
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
		if !sameDefault(t, f, documented) {
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
