package v1alpha1

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// Every annotation is a row of the README's reference table.
func TestReadmeDocumentsEveryAnnotation(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(line, "| `") {
			for _, name := range strings.Split(cells[1], ",") {
				rows[strings.Trim(strings.TrimSpace(name), "`")] = true
			}
		}
	}
	keys := append(slices.Clone(UserAnnotations), ControllerAnnotations...)
	for _, k := range keys {
		if !rows[k] {
			t.Errorf("README.md has no reference table row for %s", k)
		}
	}
}
