package specs_test

import (
	"io/fs"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/demo/specs"
)

// Every workload decodes strictly as a Pod or a Job and names claim
// templates that demo/specs/claims holds, so `make demo` never applies a
// pod that waits for a missing template.
func TestWorkloadsUseExistingTemplates(t *testing.T) {
	files, err := fs.Glob(specs.FS, "workloads/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no workloads: %v", err)
	}
	for _, f := range files {
		data, err := fs.ReadFile(specs.FS, f)
		if err != nil {
			t.Fatal(err)
		}
		var spec *v1.PodSpec
		switch {
		case strings.Contains(string(data), "\nkind: Pod\n"):
			var p v1.Pod
			if err := yaml.UnmarshalStrict(data, &p); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			spec = &p.Spec
		case strings.Contains(string(data), "\nkind: Job\n"):
			var j batchv1.Job
			if err := yaml.UnmarshalStrict(data, &j); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			spec = &j.Spec.Template.Spec
		default:
			t.Fatalf("%s is neither a Pod nor a Job", f)
		}
		for _, c := range spec.ResourceClaims {
			if c.ResourceClaimTemplateName == nil {
				continue
			}
			if _, err := specs.ClaimTemplate(*c.ResourceClaimTemplateName); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
}
