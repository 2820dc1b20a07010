package cluster

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// The probe policies decode strictly into the API types, in the order the
// waiting relies on: each policy before its binding.
func TestProbePoliciesDecode(t *testing.T) {
	docs := strings.Split(probePolicies, "\n---\n")
	targets := []any{
		&admissionv1.ValidatingAdmissionPolicy{}, &admissionv1.ValidatingAdmissionPolicyBinding{},
		&admissionv1.MutatingAdmissionPolicy{}, &admissionv1.MutatingAdmissionPolicyBinding{},
	}
	if len(docs) != len(targets) {
		t.Fatalf("%d probe documents, want %d", len(docs), len(targets))
	}
	for i, doc := range docs {
		if err := yaml.UnmarshalStrict([]byte(doc), targets[i]); err != nil {
			t.Errorf("probe document %d: %v", i, err)
		}
	}
	vap := targets[0].(*admissionv1.ValidatingAdmissionPolicy)
	mapol := targets[2].(*admissionv1.MutatingAdmissionPolicy)
	if vap.Kind != "ValidatingAdmissionPolicy" || vap.Name != probeValidating || len(vap.Spec.Validations) != 1 {
		t.Errorf("validating probe = %+v", vap)
	}
	if mapol.Kind != "MutatingAdmissionPolicy" || mapol.Name != probeMutating || len(mapol.Spec.Mutations) != 1 ||
		!strings.Contains(mapol.Spec.Mutations[0].ApplyConfiguration.Expression, probeLabel) {
		t.Errorf("mutating probe = %+v", mapol)
	}
}
