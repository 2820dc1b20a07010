package v1alpha1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	celgo "github.com/google/cel-go/cel"
	celtypes "github.com/google/cel-go/common/types"
	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// This file evaluates the admission policies of policyFile the way the API
// server does (k8s.io/apiserver's CEL environment for admission policies,
// its composition of variables and its activation of object, oldObject and
// request) and requires that gputopo-placement admits a pod or Job that
// sets its annotations exactly when Parse accepts them, with Parse's
// messages; a request that leaves the gputopo.dev/ annotations as they
// are is not checked (the policies' match condition).
//
// What it does not run is the API server's validating dispatcher, which
// pulls in half the API server; compiledPolicy.evaluate repeats its rules for
// turning evaluations into a decision and a message (validator.go of
// k8s.io/apiserver/pkg/admission/plugin/policy/validating).
//
// Listed exceptions, the differences between the policy and Parse, both in
// messages only (the decision is compared everywhere):
//   - the policy writes a value between plain double quotes, where Parse
//     escapes it with %q: a value holding '"', '\' or a character that is
//     not printable is written differently;
//   - the API server drops a messageExpression's result longer than
//     celconfig.MaxEvaluatedMessageExpressionSizeBytes or holding a line
//     break, and uses the validation's fixed message instead.
//
// Messages are compared word for word only where neither applies
// (messagesComparable, decision.Fallback), and by count elsewhere.

// The policies of policyFile, by name.
const (
	placementPolicy = "gputopo-placement"
	keysPolicy      = "gputopo-annotation-keys"
)

// The oldest Kubernetes the chart supports is 1.34, whose API server
// compiles a new policy with the CEL libraries of version 1.33.
var oldestCompatibility = version.MajorMinor(1, 33)

// loadPolicies reads every document of policyFile: the policies by name
// and the validation actions of each policy's bindings.
func loadPolicies(t testing.TB) (map[string]admissionv1.ValidatingAdmissionPolicy, map[string][]admissionv1.ValidationAction) {
	t.Helper()
	b, err := os.ReadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	policies := map[string]admissionv1.ValidatingAdmissionPolicy{}
	actions := map[string][]admissionv1.ValidationAction{}
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: document %d: %v", policyFile, i, err)
		}
		switch tm.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict(doc, &p); err != nil {
				t.Fatalf("%s: document %d: %v", policyFile, i, err)
			}
			policies[p.Name] = p
		case "ValidatingAdmissionPolicyBinding":
			var pb admissionv1.ValidatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict(doc, &pb); err != nil {
				t.Fatalf("%s: document %d: %v", policyFile, i, err)
			}
			actions[pb.Spec.PolicyName] = append(actions[pb.Spec.PolicyName], pb.Spec.ValidationActions...)
		default:
			t.Fatalf("%s: document %d is a %q", policyFile, i, tm.Kind)
		}
	}
	return policies, actions
}

// expression adapts a policy's expression to the compiler, as the API
// server's validating plugin does.
type expression struct {
	name, expr string
	returns    []*celgo.Type
}

func (e *expression) GetExpression() string      { return e.expr }
func (e *expression) ReturnTypes() []*celgo.Type { return e.returns }
func (e *expression) GetName() string            { return e.name }

// compiledPolicy is a policy compiled as the API server compiles it.
type compiledPolicy struct {
	policy      admissionv1.ValidatingAdmissionPolicy
	matches     plugincel.ConditionEvaluator
	validations plugincel.ConditionEvaluator
	messages    plugincel.ConditionEvaluator
}

// compilePolicy compiles p with the base environment of the compatibility
// version given, in the mode given (environment.NewExpressions: as a new
// policy is checked when it is created; environment.StoredExpressions: as
// a stored one is evaluated).
func compilePolicy(p admissionv1.ValidatingAdmissionPolicy, compat *version.Version, mode environment.Type) (*compiledPolicy, error) {
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(compat))
	if err != nil {
		return nil, fmt.Errorf("creating the CEL compiler: %w", err)
	}
	withAuthz := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	var errs []error
	for _, v := range p.Spec.Variables {
		r := compiler.CompileAndStoreVariable(&expression{name: v.Name, expr: v.Expression, returns: []*celgo.Type{celgo.AnyType, celgo.DynType}}, withAuthz, mode)
		if r.Error != nil {
			errs = append(errs, fmt.Errorf("variable %s: %w", v.Name, r.Error))
		}
	}
	matches := make([]plugincel.ExpressionAccessor, len(p.Spec.MatchConditions))
	for i, m := range p.Spec.MatchConditions {
		matches[i] = &expression{name: m.Name, expr: m.Expression, returns: []*celgo.Type{celgo.BoolType}}
	}
	conds := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	msgs := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		conds[i] = &expression{expr: v.Expression, returns: []*celgo.Type{celgo.BoolType}}
		if v.MessageExpression != "" {
			msgs[i] = &expression{expr: v.MessageExpression, returns: []*celgo.Type{celgo.StringType}}
		}
	}
	c := &compiledPolicy{
		policy:      p,
		matches:     compiler.CompileCondition(matches, withAuthz, mode),
		validations: compiler.CompileCondition(conds, withAuthz, mode),
		messages:    compiler.CompileCondition(msgs, plugincel.OptionalVariableDeclarations{}, mode),
	}
	for _, err := range slices.Concat(c.matches.CompilationErrors(), c.validations.CompilationErrors(), c.messages.CompilationErrors()) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("compiling policy %s: %w", p.Name, err)
	}
	return c, nil
}

// denyAll answers every authorizer check of a policy with "no".
type denyAll struct{}

func (denyAll) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", nil
}

// decision is what a policy made of a request: the messages of the
// validations that failed; none means admitted.
type decision struct {
	// Skipped: a match condition was false, so the API server did not
	// evaluate the policy's validations (and admitted the request).
	Skipped  bool
	Messages []string
	// Fallback: some message is a validation's fixed message, the
	// messageExpression's result being dropped.
	Fallback bool
}

func (d decision) admitted() bool { return len(d.Messages) == 0 }

// evaluate runs the policy on a request for obj (a *corev1.Pod,
// *batchv1.Job, *resourcev1.ResourceClaim or *resourcev1.ResourceClaimTemplate;
// old is nil on CREATE) and decides as the API server's validator does with
// failurePolicy Fail: its match conditions first (the API server's
// matcher: every one must be true), then its validations.
func (c *compiledPolicy) evaluate(obj, old runtime.Object) (decision, error) {
	var gvk schema.GroupVersionKind
	var gvr schema.GroupVersionResource
	var name string
	switch o := obj.(type) {
	case *corev1.Pod:
		gvk, gvr, name = corev1.SchemeGroupVersion.WithKind("Pod"), corev1.SchemeGroupVersion.WithResource("pods"), o.Name
	case *batchv1.Job:
		gvk, gvr, name = batchv1.SchemeGroupVersion.WithKind("Job"), batchv1.SchemeGroupVersion.WithResource("jobs"), o.Name
	case *resourcev1.ResourceClaim:
		gvk, gvr, name = resourcev1.SchemeGroupVersion.WithKind("ResourceClaim"), resourcev1.SchemeGroupVersion.WithResource("resourceclaims"), o.Name
	case *resourcev1.ResourceClaimTemplate:
		gvk, gvr, name = resourcev1.SchemeGroupVersion.WithKind("ResourceClaimTemplate"), resourcev1.SchemeGroupVersion.WithResource("resourceclaimtemplates"), o.Name
	default:
		return decision{}, fmt.Errorf("no request for a %T", obj)
	}
	op := admission.Create
	if old != nil {
		op = admission.Update
	}
	attr := admission.NewAttributesRecord(obj, old, gvk, "default", name, gvr, "", op, nil, false, nil)
	va := &admission.VersionedAttributes{Attributes: attr, VersionedObject: admission.NewLazyObject(obj), VersionedKind: gvk}
	if old != nil {
		va.VersionedOldObject = admission.NewLazyObject(old)
	}
	req := plugincel.CreateAdmissionRequest(attr, metav1.GroupVersionResource(gvr), metav1.GroupVersionKind(gvk))
	ctx := context.Background()
	matched, budget, err := c.matches.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{Authorizer: denyAll{}}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		return decision{}, fmt.Errorf("evaluating the match conditions of %s: %w", c.policy.Name, err)
	}
	for i, m := range matched {
		if m.Error != nil {
			return decision{}, fmt.Errorf("evaluating match condition %s of %s: %w", c.policy.Spec.MatchConditions[i].Name, c.policy.Name, m.Error)
		}
		if m.EvalResult != celtypes.True {
			return decision{Skipped: true}, nil
		}
	}
	results, budget, err := c.validations.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{Authorizer: denyAll{}}, nil, budget)
	if err != nil {
		return decision{}, fmt.Errorf("evaluating policy %s: %w", c.policy.Name, err)
	}
	msgResults, _, msgErr := c.messages.ForInput(ctx, va, req, plugincel.OptionalVariableBindings{}, nil, budget)
	var d decision
	for i, r := range results {
		if r.Error != nil {
			return decision{}, fmt.Errorf("evaluating validation %d of %s: %w", i, c.policy.Name, r.Error)
		}
		if r.EvalResult == celtypes.True {
			continue
		}
		v := c.policy.Spec.Validations[i]
		msg := ""
		if msgErr == nil && i < len(msgResults) && msgResults[i].Error == nil && msgResults[i].EvalResult != nil {
			if s, ok := msgResults[i].EvalResult.Value().(string); ok {
				msg = strings.TrimSpace(s)
				if len(msg) > celconfig.MaxEvaluatedMessageExpressionSizeBytes || strings.Contains(msg, "\n") {
					msg = ""
				}
			}
		} else if v.MessageExpression != "" && (msgErr != nil || msgResults[i].Error != nil) {
			return decision{}, fmt.Errorf("evaluating the messageExpression of validation %d of %s: %w", i, c.policy.Name, errors.Join(msgErr, msgResults[i].Error))
		}
		if msg == "" {
			d.Fallback = v.MessageExpression != ""
			msg = strings.TrimSpace(v.Message)
		}
		if msg == "" {
			msg = "failed expression: " + strings.TrimSpace(v.Expression)
		}
		d.Messages = append(d.Messages, msg)
	}
	return d, nil
}

func podWith(ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Annotations: ann},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

func jobWith(ann map[string]string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "default"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: ann},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}},
	}
}

// requests are the requests a set of annotations reaches the policies in:
// a new pod, an update that gives them to a pod that had none, a new Job
// whose pod template has them. (An update that leaves them as they are is
// not checked: TestPolicyChecksChangedAnnotationsOnly.)
func requests(ann map[string]string) map[string][2]runtime.Object {
	return map[string][2]runtime.Object{
		"create pod": {podWith(ann), nil},
		"update pod": {podWith(ann), podWith(nil)},
		"create Job": {jobWith(ann), nil},
	}
}

func mustCompile(t testing.TB, name string) *compiledPolicy {
	t.Helper()
	policies, _ := loadPolicies(t)
	p, ok := policies[name]
	if !ok {
		t.Fatalf("%s has no policy %s", policyFile, name)
	}
	c, err := compilePolicy(p, environment.DefaultCompatibilityVersion(), environment.StoredExpressions)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The API server refuses to create a policy that does not compile with
// the CEL libraries of its compatibility version: check the oldest the
// chart supports and this module's.
func TestPoliciesCompile(t *testing.T) {
	policies, actions := loadPolicies(t)
	for _, compat := range []*version.Version{oldestCompatibility, environment.DefaultCompatibilityVersion()} {
		for name, p := range policies {
			if _, err := compilePolicy(p, compat, environment.NewExpressions); err != nil {
				t.Errorf("CEL %s: %v", compat, err)
			}
			if len(actions[name]) == 0 {
				t.Errorf("%s binds policy %s nowhere", policyFile, name)
			}
		}
	}
	want := map[string][]admissionv1.ValidationAction{placementPolicy: {admissionv1.Deny}, keysPolicy: {admissionv1.Warn}}
	if diff := cmp.Diff(want, actions); diff != "" {
		t.Errorf("validation actions of the bindings in %s (-want +got):\n%s", policyFile, diff)
	}
}

// The check above refuses what an API server of oldestCompatibility
// refuses: a list function of the CEL library that came with Kubernetes 1.34.
func TestOldestCompatibilityRefusesNewerCEL(t *testing.T) {
	p := admissionv1.ValidatingAdmissionPolicy{Spec: admissionv1.ValidatingAdmissionPolicySpec{
		Validations: []admissionv1.Validation{{Expression: "[1, 2].slice(0, 1) == [1]"}},
	}}
	if _, err := compilePolicy(p, oldestCompatibility, environment.NewExpressions); err == nil {
		t.Errorf("CEL %s compiles list.slice(), which came with CEL 1.34", oldestCompatibility)
	}
	if _, err := compilePolicy(p, version.MajorMinor(1, 34), environment.NewExpressions); err != nil {
		t.Errorf("CEL 1.34: %v", err)
	}
}

// parseMessages is Parse's verdict as a policy decision: one message per
// problem.
func parseMessages(ann map[string]string) []string {
	_, err := Parse(ann)
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

// messagesComparable: every value is written alike by %q and by CEL's
// '"' + value + '"', and no message of Parse's would be dropped for its
// size.
func messagesComparable(ann map[string]string, parse []string) bool {
	for _, v := range ann {
		if strconv.Quote(v) != `"`+v+`"` {
			return false
		}
	}
	for _, m := range parse {
		if len(m) > celconfig.MaxEvaluatedMessageExpressionSizeBytes {
			return false
		}
	}
	return true
}

// agree checks the placement policy against Parse on ann in every request,
// and reports whether it did and whether the messages were compared word
// for word in every request.
func agree(t *testing.T, c *compiledPolicy, ann map[string]string) (ok, wordForWord bool) {
	t.Helper()
	parse := parseMessages(ann)
	ok, wordForWord = true, true
	for what, objs := range requests(ann) {
		d, err := c.evaluate(objs[0], objs[1])
		if err != nil {
			t.Errorf("%s with %q: %v", what, ann, err)
			ok = false
			continue
		}
		if d.admitted() != (len(parse) == 0) {
			t.Errorf("%s with %q: policy admits: %t, Parse accepts: %t\npolicy: %q\nParse: %q", what, ann, d.admitted(), len(parse) == 0, d.Messages, parse)
			ok = false
			continue
		}
		got := slices.Sorted(slices.Values(d.Messages))
		want := slices.Sorted(slices.Values(parse))
		wordForWord = wordForWord && !d.Fallback && messagesComparable(ann, parse)
		if !d.Fallback && messagesComparable(ann, parse) {
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s with %q: messages (-Parse +policy):\n%s", what, ann, diff)
				ok = false
			}
		} else if len(got) != len(want) {
			t.Errorf("%s with %q: policy gives %d messages %q, Parse %d %q", what, ann, len(got), got, len(want), want)
			ok = false
		}
	}
	return ok, wordForWord
}

// TestPolicyAgreesWithParseTable: values chosen by hand, each with what
// Parse (and so the policy) must make of it.
func TestPolicyAgreesWithParseTable(t *testing.T) {
	c := mustCompile(t, placementPolicy)
	longLabel := strings.Repeat("a", 63)
	longName := strings.Repeat(strings.Repeat("a", 62)+".", 5)[:253]
	tests := []struct {
		name  string
		ann   map[string]string
		valid bool
	}{
		{"none", nil, true},
		{"unrelated", map[string]string{"example.com/x": "Bad_Group"}, true},
		{"empty placement", map[string]string{AnnotationPlacement: ""}, true},
		{"every placement", map[string]string{AnnotationPlacement: "adjacent-leaves"}, true},
		{"placement case", map[string]string{AnnotationPlacement: "Auto"}, false},
		{"placement space", map[string]string{AnnotationPlacement: "auto "}, false},
		{"placement newline", map[string]string{AnnotationPlacement: "auto\n"}, false},
		{"empty strategy", map[string]string{AnnotationStrategy: ""}, true},
		{"strategy", map[string]string{AnnotationStrategy: "distributed"}, true},
		{"bad strategy", map[string]string{AnnotationStrategy: "packed"}, false},
		{"domain", map[string]string{AnnotationPreferredDomain: "Leaf_2.a"}, true},
		{"empty domain", map[string]string{AnnotationPreferredDomain: ""}, true},
		{"domain 63", map[string]string{AnnotationPreferredDomain: longLabel}, true},
		{"domain 64", map[string]string{AnnotationPreferredDomain: longLabel + "a"}, false},
		{"domain ends with -", map[string]string{AnnotationPreferredDomain: "leaf-"}, false},
		{"domain unicode", map[string]string{AnnotationPreferredDomain: "léaf"}, false},
		{"domain space", map[string]string{AnnotationPreferredDomain: "leaf 3"}, false},
		{"required", map[string]string{AnnotationPreferredDomain: "leaf-1", AnnotationPreferredRequired: "true"}, true},
		{"required false alone", map[string]string{AnnotationPreferredRequired: "false"}, true},
		{"required alone", map[string]string{AnnotationPreferredRequired: "true"}, false},
		{"required empty domain", map[string]string{AnnotationPreferredDomain: "", AnnotationPreferredRequired: "true"}, false},
		{"required bad domain", map[string]string{AnnotationPreferredDomain: "-", AnnotationPreferredRequired: "true"}, false},
		{"required True", map[string]string{AnnotationPreferredDomain: "leaf-1", AnnotationPreferredRequired: "True"}, false},
		{"required empty", map[string]string{AnnotationPreferredRequired: ""}, false},
		{"group", map[string]string{AnnotationGroup: "ring.a-1", AnnotationGroupSize: "8"}, true},
		{"Bad_Group", map[string]string{AnnotationGroup: "Bad_Group", AnnotationGroupSize: "2"}, false},
		{"group upper", map[string]string{AnnotationGroup: "Ring", AnnotationGroupSize: "2"}, false},
		{"group 253", map[string]string{AnnotationGroup: longName, AnnotationGroupSize: "2"}, true},
		{"group 254", map[string]string{AnnotationGroup: longName + "a", AnnotationGroupSize: "2"}, false},
		{"group label of 64", map[string]string{AnnotationGroup: longLabel + "a", AnnotationGroupSize: "2"}, true},
		{"group trailing dot", map[string]string{AnnotationGroup: "ring.", AnnotationGroupSize: "2"}, false},
		{"group unicode", map[string]string{AnnotationGroup: "rïng", AnnotationGroupSize: "2"}, false},
		{"group without size", map[string]string{AnnotationGroup: "ring"}, false},
		{"empty group alone", map[string]string{AnnotationGroup: ""}, true},
		{"empty group with size", map[string]string{AnnotationGroup: "", AnnotationGroupSize: "2"}, false},
		{"size alone", map[string]string{AnnotationGroupSize: "2"}, false},
		{"bad size alone", map[string]string{AnnotationGroupSize: "0"}, false},
		{"size 1", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "1"}, true},
		{"size 4096", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "4096"}, true},
		{"size 4097", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "4097"}, false},
		{"size 0", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "0"}, false},
		{"size -1", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "-1"}, false},
		{"size +8", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "+8"}, true},
		{"size 0008", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "0008"}, true},
		{"size -0", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "-0"}, false},
		{"size ++8", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "++8"}, false},
		{"size many zeros", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: strings.Repeat("0", 40) + "4096"}, true},
		{"size overflows", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "99999999999999999999"}, false},
		{"size empty", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: ""}, false},
		{"size space", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: " 8"}, false},
		{"size arabic digit", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "٨"}, false},
		{"size fullwidth digit", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "８"}, false},
		{"size 1e3", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "1e3"}, false},
		{"size 0x10", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "0x10"}, false},
		{"size 1_0", map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "1_0"}, false},
		{"everything", map[string]string{AnnotationPlacement: "same-leaf", AnnotationStrategy: "consolidated", AnnotationPreferredDomain: "leaf-3",
			AnnotationPreferredRequired: "true", AnnotationGroup: "ring", AnnotationGroupSize: "8"}, true},
		{"everything wrong", map[string]string{AnnotationPlacement: "x", AnnotationStrategy: "y", AnnotationPreferredDomain: "z z",
			AnnotationPreferredRequired: "yes", AnnotationGroup: "Bad_Group"}, false},
		{"long value", map[string]string{AnnotationPlacement: strings.Repeat("x", 6000)}, false},
		{"invalid UTF-8", map[string]string{AnnotationGroup: "ring\xff", AnnotationGroupSize: "2"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse(tc.ann); (err == nil) != tc.valid {
				t.Errorf("Parse(%q) = %v, want valid: %t", tc.ann, err, tc.valid)
			}
			agree(t, c, tc.ann)
		})
	}
}

// The values the corpus draws from, for each annotation Parse reads.
var (
	validValues = map[string][]string{
		AnnotationPlacement:         append([]string{""}, strs(Placements)...),
		AnnotationStrategy:          append([]string{""}, strs(Strategies)...),
		AnnotationPreferredDomain:   {"", "leaf-0", "spine-1", "A", "9", "a.b_c-d", strings.Repeat("z", 63)},
		AnnotationPreferredRequired: {"true", "false"},
		AnnotationGroup:             {"", "g", "ring", "train-7", "a.b.c", "0", strings.Repeat("x", 253)},
		AnnotationGroupSize:         {"1", "2", "8", "64", "4096", "+3", "007", "0004096"},
	}
	invalidValues = map[string][]string{
		AnnotationPlacement:         {"same_leaf", "Same-Leaf", " auto", "none ", "leaf", "auto,none"},
		AnnotationStrategy:          {"packed", "Balanced", "balanced\n", "spread"},
		AnnotationPreferredDomain:   {"-", "a-", ".a", "a b", "leaf/0", strings.Repeat("z", 64), "lëaf", "leaf\x00"},
		AnnotationPreferredRequired: {"", "True", "1", "yes", " true", "FALSE"},
		AnnotationGroup:             {"Bad_Group", "-a", "a-", "a..b", ".a", "a.", "A", "a b", strings.Repeat("x", 254), "группа"},
		AnnotationGroupSize:         {"", "0", "-1", "-0", "4097", "10000", "+-1", "1.0", "1e2", "0x1", " 1", "1 ", "٣", "２", "9223372036854775807", "18446744073709551616"},
	}
	// runes random values are made of: what the rules accept, what they
	// accept only in places, and what they never accept.
	runes = []rune("abcxyzABCXYZ0123456789-._+ /\"\\\n\té߀İ٣２\u200b😀\ufffd")
)

// randomValue makes a value for key: a valid or an invalid one, one
// changed by a letter, a random string, or one of a length at a limit.
func randomValue(r *rand.Rand, key string) string {
	pick := func(vs []string) string { return vs[r.IntN(len(vs))] }
	switch n := r.IntN(10); {
	case n < 3:
		return pick(validValues[key])
	case n < 5:
		return pick(invalidValues[key])
	case n < 7:
		v := []rune(pick(validValues[key]))
		i := r.IntN(len(v) + 1)
		switch r.IntN(3) {
		case 0: // insert
			v = slices.Insert(v, i, runes[r.IntN(len(runes))])
		case 1: // remove
			if i < len(v) {
				v = slices.Delete(v, i, i+1)
			}
		default: // replace
			if i < len(v) {
				v[i] = runes[r.IntN(len(runes))]
			}
		}
		return string(v)
	case n < 9:
		v := make([]rune, r.IntN(12))
		for i := range v {
			v[i] = runes[r.IntN(len(runes))]
		}
		return string(v)
	default:
		// A name or number at a length limit, give or take one.
		var unit string
		switch key {
		case AnnotationGroupSize:
			unit = "0"
		case AnnotationGroup:
			unit = "a.b"
		default:
			unit = "a"
		}
		limit := []int{63, 253, 4096}[r.IntN(3)] + r.IntN(3) - 1
		v := strings.Repeat(unit, limit/len(unit)+1)[:limit]
		if key == AnnotationGroupSize {
			v = v[:len(v)-1] + "7"
		}
		if r.IntN(4) == 0 {
			v += "\xff" // not UTF-8
		}
		return v
	}
}

// randomAnnotations makes a set of the annotations Parse reads. A third
// are valid but for at most one value, so that most rules are met and the
// one broken decides; the rest draw every value at random.
func randomAnnotations(r *rand.Rand) map[string]string {
	ann := map[string]string{}
	if r.IntN(3) == 0 {
		for _, key := range UserAnnotations {
			if r.IntN(2) == 0 {
				ann[key] = validValues[key][r.IntN(len(validValues[key]))]
			}
		}
		if ann[AnnotationGroup] != "" || ann[AnnotationGroupSize] != "" {
			ann[AnnotationGroup] = "g"
			ann[AnnotationGroupSize] = validValues[AnnotationGroupSize][r.IntN(len(validValues[AnnotationGroupSize]))]
		}
		if ann[AnnotationPreferredRequired] == "true" && ann[AnnotationPreferredDomain] == "" {
			ann[AnnotationPreferredDomain] = "leaf-1"
		}
		if r.IntN(2) == 0 {
			key := UserAnnotations[r.IntN(len(UserAnnotations))]
			ann[key] = randomValue(r, key)
		}
	} else {
		for _, key := range UserAnnotations {
			if r.IntN(2) == 0 {
				ann[key] = randomValue(r, key)
			}
		}
	}
	if r.IntN(8) == 0 {
		ann["example.com/"+strings.TrimPrefix(UserAnnotations[r.IntN(len(UserAnnotations))], Prefix)] = "x"
	}
	return ann
}

// TestPolicyAgreesWithParse: on a seeded corpus, the placement policy
// admits exactly the annotations Parse accepts, with Parse's messages.
func TestPolicyAgreesWithParse(t *testing.T) {
	c := mustCompile(t, placementPolicy)
	n := 3000
	if testing.Short() {
		n = 300
	}
	r := rand.New(rand.NewPCG(1, 2))
	agreed, valid, invalidUTF8, wordForWord := 0, 0, 0, 0
	for i := range n {
		ann := randomAnnotations(r)
		if _, err := Parse(ann); err == nil {
			valid++
		}
		for _, v := range ann {
			if !utf8.ValidString(v) {
				invalidUTF8++
				break
			}
		}
		ok, words := agree(t, c, ann)
		if ok {
			agreed++
		}
		if words {
			wordForWord++
		}
		if i+1-agreed >= 20 {
			t.Fatalf("stopping after %d annotation sets, %d of which disagree", i+1, i+1-agreed)
		}
	}
	t.Logf("%d of %d annotation sets agree in every request (%d valid, %d with a value that is not UTF-8; messages compared word for word for %d)", agreed, n, valid, invalidUTF8, wordForWord)
	if valid < n/10 || valid > n*9/10 {
		t.Errorf("the corpus has %d valid annotation sets of %d: too few of one kind to compare", valid, n)
	}
}

// knownKeys are the gputopo.dev/ annotations of a pod or pod template.
func knownKeys() []string { return append(slices.Clone(UserAnnotations), ControllerAnnotations...) }

func TestPolicyKnowsAnnotationKeys(t *testing.T) {
	policies, _ := loadPolicies(t)
	p := policies[keysPolicy]
	var got []string
	for _, v := range p.Spec.Variables {
		if v.Name == "knownKeys" {
			got = quotedIn(v.Expression)
		}
	}
	if diff := cmp.Diff(knownKeys(), got); diff != "" {
		t.Errorf("variable knownKeys of %s in %s (-UserAnnotations, ControllerAnnotations +policy):\n%s", keysPolicy, policyFile, diff)
	}
	for i, v := range p.Spec.Validations {
		if list := strings.Join(knownKeys(), ", "); !strings.HasSuffix(v.Message, list) {
			t.Errorf("the message of validation %d of %s does not end in the known keys %s: %q", i, keysPolicy, list, v.Message)
		}
	}
}

// editDistance is the optimal string alignment distance of a and b: the
// fewest insertions, removals, replacements and swaps of neighbours that
// turn one into the other.
func editDistance(a, b []rune) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// wantWarning is the warning the keys policy gives for one unknown key: the
// known keys within one edit of it, case and "_" for "-" aside.
func wantWarning(key string) string {
	name := []rune(strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(key, Prefix)), "_", "-"))
	var near []string
	for _, k := range knownKeys() {
		if editDistance(name, []rune(strings.TrimPrefix(k, Prefix))) <= 1 {
			near = append(near, k)
		}
	}
	w := "unknown annotation " + key + "."
	if len(near) > 0 {
		w = "unknown annotation " + key + ": did you mean " + strings.Join(near, " or ") + "?"
	}
	return w + " Known keys: " + strings.Join(knownKeys(), ", ")
}

func TestUnknownKeysWarned(t *testing.T) {
	c := mustCompile(t, keysPolicy)
	known := " Known keys: " + strings.Join(knownKeys(), ", ")
	tests := []struct {
		name     string
		ann, old map[string]string
		job      bool
		want     []string
	}{
		{name: "none"},
		{name: "known", ann: map[string]string{AnnotationPlacement: "x", AnnotationGroup: "g", AnnotationDomain: "leaf:leaf-1"}},
		{name: "other prefix", ann: map[string]string{"example.com/placment": "x", "sub.gputopo.dev/placment": "x"}},
		{name: "letter missing", ann: map[string]string{"gputopo.dev/placment": "auto"},
			want: []string{"unknown annotation gputopo.dev/placment: did you mean gputopo.dev/placement?" + known}},
		{name: "letter added", ann: map[string]string{"gputopo.dev/groups": "g"},
			want: []string{"unknown annotation gputopo.dev/groups: did you mean gputopo.dev/group?" + known}},
		{name: "swapped", ann: map[string]string{"gputopo.dev/stratgey": "balanced"},
			want: []string{"unknown annotation gputopo.dev/stratgey: did you mean gputopo.dev/strategy?" + known}},
		{name: "case and underscore", ann: map[string]string{"gputopo.dev/Group_Size": "2"},
			want: []string{"unknown annotation gputopo.dev/Group_Size: did you mean gputopo.dev/group-size?" + known}},
		{name: "far", ann: map[string]string{"gputopo.dev/rack": "r1"},
			want: []string{"unknown annotation gputopo.dev/rack." + known}},
		{name: "in a Job's pod template", job: true, ann: map[string]string{"gputopo.dev/placement-policy": "auto"},
			want: []string{"unknown annotation gputopo.dev/placement-policy." + known}},
		{name: "there before", ann: map[string]string{"gputopo.dev/rack": "r1"}, old: map[string]string{"gputopo.dev/rack": "r0"}},
		{name: "added on update", ann: map[string]string{"gputopo.dev/nodes": "n", "gputopo.dev/rack": "r1"}, old: map[string]string{"gputopo.dev/rack": "r0"},
			want: []string{"unknown annotation gputopo.dev/nodes: did you mean gputopo.dev/node?" + known}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var obj, old runtime.Object = podWith(tc.ann), nil
			if tc.job {
				obj = jobWith(tc.ann)
			}
			if tc.old != nil {
				old = podWith(tc.old)
			}
			d, err := c.evaluate(obj, old)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d.Messages); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			for _, w := range tc.want {
				if key := strings.Fields(w)[2]; wantWarning(strings.TrimRight(key, ":.")) != w {
					t.Errorf("wantWarning(%s) = %q, the table says %q", key, wantWarning(strings.TrimRight(key, ":.")), w)
				}
			}
		})
	}
}

// TestUnknownKeysSuggestions: for keys one or two edits away from a known
// one, the policy suggests the known keys editDistance finds.
func TestUnknownKeysSuggestions(t *testing.T) {
	c := mustCompile(t, keysPolicy)
	edits := []rune("abcdeglnoprstuz-_.AGPS0")
	r := rand.New(rand.NewPCG(3, 4))
	n, tried, suggested := 1000, 0, 0
	if testing.Short() {
		n = 100
	}
	for range n {
		known := knownKeys()
		name := []rune(strings.TrimPrefix(known[r.IntN(len(known))], Prefix))
		for range 1 + r.IntN(2) {
			i := r.IntN(len(name))
			switch r.IntN(4) {
			case 0:
				name = slices.Insert(name, i, edits[r.IntN(len(edits))])
			case 1:
				name = slices.Delete(name, i, i+1)
			case 2:
				name[i] = edits[r.IntN(len(edits))]
			default:
				if i+1 < len(name) {
					name[i], name[i+1] = name[i+1], name[i]
				}
			}
		}
		key := Prefix + string(name)
		if len(validation.IsQualifiedName(key)) > 0 || slices.Contains(known, key) {
			continue // the API server refuses the key, or it is known
		}
		tried++
		want := wantWarning(key)
		if strings.Contains(want, "did you mean") {
			suggested++
		}
		for what, objs := range map[string]runtime.Object{"pod": podWith(map[string]string{key: "x"}), "Job": jobWith(map[string]string{key: "x"})} {
			d, err := c.evaluate(objs, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{want}, d.Messages); diff != "" {
				t.Errorf("%s with %s: warnings (-want +got):\n%s", what, key, diff)
			}
		}
	}
	t.Logf("%d of %d unknown keys got a suggestion", suggested, tried)
	if suggested == 0 || suggested == tried {
		t.Errorf("%d of %d unknown keys got a suggestion: too few of one kind to compare", suggested, tried)
	}
}

func claimWith(ann map[string]string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", Annotations: ann}}
}

func claimTemplateWith(ann map[string]string) *resourcev1.ResourceClaimTemplate {
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "default"},
		Spec:       resourcev1.ResourceClaimTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: ann}},
	}
}

// TestPolicyChecksChangedAnnotationsOnly: both policies evaluate their
// validations for a request that sets, changes or removes a gputopo.dev/
// annotation (of a pod, a Job's pod template, a claim, or a template's
// claims) and skip every other request, however its other annotations and
// fields change: an update that leaves annotations Parse refuses as they
// are is admitted, though a pod created with them is not.
func TestPolicyChecksChangedAnnotationsOnly(t *testing.T) {
	bad := map[string]string{AnnotationPlacement: "Auto"}
	placed := map[string]string{AnnotationPlacement: "auto", "example.com/x": "1"}
	relabelled := func(p *corev1.Pod) *corev1.Pod {
		p.Labels = map[string]string{"app": "x"}
		p.Finalizers = []string{"batch.kubernetes.io/job-tracking"}
		return p
	}
	tests := []struct {
		name     string
		obj, old runtime.Object
		checked  bool
	}{
		{"new pod without annotations", podWith(nil), nil, false},
		{"new pod with other annotations", podWith(map[string]string{"example.com/placement": "x", "sub.gputopo.dev/x": "y"}), nil, false},
		{"new pod with one", podWith(placed), nil, true},
		{"new pod with an empty one", podWith(map[string]string{AnnotationGroup: ""}), nil, true},
		{"pod update leaving them", relabelled(podWith(placed)), podWith(placed), false},
		{"pod update leaving bad ones", relabelled(podWith(bad)), podWith(bad), false},
		{"pod update of another annotation", podWith(map[string]string{AnnotationPlacement: "auto", "example.com/x": "2"}), podWith(placed), false},
		{"pod update changing one", podWith(map[string]string{AnnotationPlacement: "none", "example.com/x": "1"}), podWith(placed), true},
		{"pod update adding one", podWith(placed), podWith(map[string]string{"example.com/x": "1"}), true},
		{"pod update removing one", podWith(map[string]string{"example.com/x": "1"}), podWith(placed), true},
		{"pod update removing the last", podWith(nil), podWith(map[string]string{AnnotationStatus: "s"}), true},
		{"Job update leaving them", jobWith(placed), jobWith(placed), false},
		{"Job update changing one", jobWith(map[string]string{AnnotationPlacement: "same-leaf"}), jobWith(placed), true},
		{"new Job with one", jobWith(placed), nil, true},
		{"new Job without", jobWith(nil), nil, false},
		{"new claim of a template", claimWith(map[string]string{"resource.kubernetes.io/pod-claim-name": "gpu"}), nil, false},
		{"new claim with one", claimWith(map[string]string{AnnotationAllocatedBy: "default/job/j"}), nil, true},
		{"claim update adding one", claimWith(map[string]string{AnnotationAllocatedBy: "default/job/j"}), claimWith(nil), true},
		{"claim update leaving them", claimWith(map[string]string{AnnotationAllocatedBy: "default/job/j"}), claimWith(map[string]string{AnnotationAllocatedBy: "default/job/j"}), false},
		{"new template whose claims get one", claimTemplateWith(map[string]string{AnnotationDomain: "leaf:l"}), nil, true},
		{"new template without", claimTemplateWith(map[string]string{"example.com/x": "1"}), nil, false},
	}
	for _, policy := range []string{placementPolicy, keysPolicy} {
		c := mustCompile(t, policy)
		for _, tc := range tests {
			switch tc.obj.(type) {
			case *resourcev1.ResourceClaim, *resourcev1.ResourceClaimTemplate:
				if policy == keysPolicy {
					continue // the keys policy matches pods and Jobs only
				}
			}
			t.Run(policy+"/"+tc.name, func(t *testing.T) {
				d, err := c.evaluate(tc.obj, tc.old)
				if err != nil {
					t.Fatal(err)
				}
				if d.Skipped == tc.checked {
					t.Errorf("validations evaluated: %t, want %t", !d.Skipped, tc.checked)
				}
			})
		}
	}
	// The bad annotations the update above leaves alone are refused when set.
	if _, err := Parse(bad); err == nil {
		t.Fatalf("Parse(%q) accepts it", bad)
	}
	if d, err := mustCompile(t, placementPolicy).evaluate(podWith(bad), nil); err != nil || d.admitted() {
		t.Errorf("a new pod with %q: %+v, %v; want it refused", bad, d, err)
	}
}

// BenchmarkPolicyRequest: the CPU the API server spends in each policy on
// one request, as it runs them (match conditions, then validations), and
// with the match conditions removed ("every-request": the validations on
// every request, as before the condition). Requests: pods that do not use
// gputopo (created, relabelled), a pod of a gputopo Job (created, then
// its gate opened by the controller, which writes gputopo.dev/ annotations),
// and a claim kube-controller-manager makes from a template.
func BenchmarkPolicyRequest(b *testing.B) {
	plain := map[string]string{"example.com/owner": "team-a", "kubectl.kubernetes.io/default-container": "main"}
	managed := map[string]string{AnnotationPlacement: "auto", AnnotationGroup: "train-7", AnnotationGroupSize: "8", "example.com/owner": "team-a"}
	opened := maps.Clone(managed)
	opened[AnnotationDomain], opened[AnnotationNode] = "leaf:leaf-3", "gpu-s0-l3-n2"
	relabelled := podWith(plain)
	relabelled.Labels = map[string]string{"app": "x"}
	requests := []struct {
		name     string
		obj, old runtime.Object
	}{
		{"plain-pod-create", podWith(plain), nil},
		{"plain-pod-relabel", relabelled, podWith(plain)},
		{"gputopo-pod-create", podWith(managed), nil},
		{"gputopo-pod-gate-opened", podWith(opened), podWith(managed)},
		{"template-claim-create", claimWith(map[string]string{"resource.kubernetes.io/pod-claim-name": "gpu"}), nil},
	}
	for _, policy := range []string{placementPolicy, keysPolicy} {
		policies, _ := loadPolicies(b)
		p := policies[policy]
		unconditioned := *p.DeepCopy()
		unconditioned.Spec.MatchConditions = nil
		for _, variant := range []struct {
			name string
			p    admissionv1.ValidatingAdmissionPolicy
		}{{"as-shipped", p}, {"every-request", unconditioned}} {
			c, err := compilePolicy(variant.p, environment.DefaultCompatibilityVersion(), environment.StoredExpressions)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range requests {
				if _, claim := r.obj.(*resourcev1.ResourceClaim); claim && policy == keysPolicy {
					continue // the keys policy matches pods and Jobs only
				}
				b.Run(policy+"/"+variant.name+"/"+r.name, func(b *testing.B) {
					for b.Loop() {
						if _, err := c.evaluate(r.obj, r.old); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
