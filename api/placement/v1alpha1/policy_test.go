package v1alpha1

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// policyFile is the admission policy that enforces this package's rules
// at admission; its CEL spells out the same names and values.
const policyFile = "../../../deployments/admission/placement-validation.yaml"

func loadPolicy(t *testing.T) admissionv1.ValidatingAdmissionPolicy {
	t.Helper()
	p := firstDoc[admissionv1.ValidatingAdmissionPolicy](t, policyFile)
	if p.Kind != "ValidatingAdmissionPolicy" {
		t.Fatalf("%s: first document is a %s", policyFile, p.Kind)
	}
	return p
}

// firstDoc reads the first YAML document of file.
func firstDoc[T any](t *testing.T, file string) T {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := bytes.Cut(b, []byte("\n---\n"))
	var out T
	if err := yaml.UnmarshalStrict(doc, &out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return out
}

var quoted = regexp.MustCompile(`'([^']*)'`)

// quotedIn lists the single-quoted CEL strings of expr.
func quotedIn(expr string) []string {
	var out []string
	for _, m := range quoted.FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestPolicyKnowsControllerAnnotations(t *testing.T) {
	p := loadPolicy(t)
	var keys []string
	for _, v := range p.Spec.Variables {
		if v.Name == "controllerKeys" {
			keys = quotedIn(v.Expression)
		}
	}
	if diff := cmp.Diff(ControllerAnnotations, keys); diff != "" {
		t.Errorf("variable controllerKeys of %s (-ControllerAnnotations +policy):\n%s", policyFile, diff)
	}
	check := "authorizer.group('" + ControllerPermissionGroup + "').resource('" + ControllerPermissionResource + "').check('" + ControllerPermissionVerb + "').allowed()"
	found := false
	for _, v := range p.Spec.Validations {
		found = found || strings.Contains(v.Expression, check)
	}
	if !found {
		t.Errorf("no validation of %s asks %s", policyFile, check)
	}
}

func TestPolicyKnowsPlacementsAndStrategies(t *testing.T) {
	p := loadPolicy(t)
	lists := map[string][]string{}
	for _, v := range p.Spec.Validations {
		for _, key := range []string{AnnotationPlacement, AnnotationStrategy} {
			prefix := "variables.podAnn['" + key + "'] in "
			if _, list, ok := strings.Cut(v.Expression, prefix); ok {
				lists[key] = quotedIn(list[:strings.Index(list, "]")+1])
			}
		}
	}
	want := map[string][]string{
		AnnotationPlacement: append([]string{""}, strs(Placements)...),
		AnnotationStrategy:  append([]string{""}, strs(Strategies)...),
	}
	if diff := cmp.Diff(want, lists); diff != "" {
		t.Errorf("values %s accepts (-want +policy):\n%s", policyFile, diff)
	}
}

func strs[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// The scheduling-gate policy writes AdmittedStatus on every pod it gates,
// and the validation policy lets exactly that note through on a new pod,
// which it otherwise refuses as the controller's.
func TestPoliciesSpellTheAdmittedStatus(t *testing.T) {
	const gateFile = "../../../deployments/admission/scheduling-gate.yaml"
	gate := firstDoc[admissionv1.MutatingAdmissionPolicy](t, gateFile)
	want := `{"` + AnnotationStatus + `": "` + AdmittedStatus + `"}`
	if len(gate.Spec.Mutations) != 1 || gate.Spec.Mutations[0].ApplyConfiguration == nil ||
		!strings.Contains(gate.Spec.Mutations[0].ApplyConfiguration.Expression, want) {
		t.Errorf("the mutation of %s does not write %s", gateFile, want)
	}
	found := false
	for _, v := range loadPolicy(t).Spec.Variables {
		found = found || (v.Name == "touched" && strings.Contains(v.Expression, `'`+AnnotationStatus+`'`) && strings.Contains(v.Expression, `"`+AdmittedStatus+`"`))
	}
	if !found {
		t.Errorf("variable touched of %s does not let %s=%q through", policyFile, AnnotationStatus, AdmittedStatus)
	}
}
