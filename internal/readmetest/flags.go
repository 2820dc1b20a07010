// Package readmetest reads README.md's reference tables for the tests
// that keep them true to the code.
package readmetest

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

var tick = regexp.MustCompile("`([^`]*)`")

// FlagTable reads the flag table under heading (a whole line, such as
// "### `gputopo-controller` flags") of the README at path. named holds
// every flag a row names; defaults the documented default of each flag
// whose row's default cell holds only literal values, one per flag of the
// row. Rows whose default is prose ("in-cluster", "same as
// `--nvidia-driver-root`") or names another flag or a variable give no
// default.
func FlagTable(path, heading string) (defaults map[string]string, named map[string]bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	_, sec, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		return nil, nil, fmt.Errorf("%s has no %q", path, heading)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	defaults, named = map[string]string{}, map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`-") {
			continue
		}
		var flags []string
		for _, m := range tick.FindAllStringSubmatch(cells[1], -1) {
			name := strings.TrimLeft(m[1], "-")
			flags = append(flags, name)
			named[name] = true
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
	return defaults, named, nil
}

// SameDefault reports whether documented, as a README writes it, is the
// flag's default: durations compare as durations, lists without their
// brackets.
func SameDefault(f *pflag.Flag, documented string) (bool, error) {
	switch f.Value.Type() {
	case "duration":
		d, err := time.ParseDuration(documented)
		if err != nil {
			return false, fmt.Errorf("--%s: documented default %q is not a duration", f.Name, documented)
		}
		return d.String() == f.DefValue, nil
	case "uintSlice", "stringSlice", "intSlice":
		return strings.Trim(f.DefValue, "[]") == documented, nil
	}
	return f.DefValue == documented, nil
}
