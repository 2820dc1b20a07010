package v1alpha1

import (
	"slices"
	"testing"

	"github.com/gputopo/gputopo/internal/readmetest"
)

// Every annotation is a row of the README's reference table.
func TestReadmeDocumentsEveryAnnotation(t *testing.T) {
	rows, err := readmetest.ReferenceNames("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	keys := append(slices.Clone(UserAnnotations), ControllerAnnotations...)
	for _, k := range keys {
		if !rows[k] {
			t.Errorf("README.md has no reference table row for %s", k)
		}
	}
}
