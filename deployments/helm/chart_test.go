// Package helm_test checks the gputopo Helm chart against the rest of the
// repository without a helm binary (hack/verify-chart.sh renders it):
// the admission policies it ships are deployments/admission/*.yaml verbatim,
// its controller holds the permission the placement policy asks for,
// its DeviceClass selects what demo/specs/deviceclass.yaml selects, and
// values.yaml, values.schema.json and the comments in values.yaml agree.
package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	yaml "go.yaml.in/yaml/v3"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

const chart = "gputopo"

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The chart renders files/admission/* with .Files.Get; they must stay the
// very files the rest of the project (tests, docs) uses.
func TestAdmissionPoliciesMatchDeployments(t *testing.T) {
	src, err := filepath.Glob("../admission/*.yaml")
	if err != nil || len(src) == 0 {
		t.Fatalf("no deployments/admission/*.yaml (err %v)", err)
	}
	copies, _ := filepath.Glob(filepath.Join(chart, "files/admission/*.yaml"))
	if len(copies) != len(src) {
		t.Errorf("chart has %d admission files, deployments/admission has %d: copy them with\n  cp deployments/admission/*.yaml deployments/helm/gputopo/files/admission/", len(copies), len(src))
	}
	for _, s := range src {
		c := filepath.Join(chart, "files/admission", filepath.Base(s))
		got, err := os.ReadFile(c)
		if err != nil {
			t.Errorf("%s: %v", c, err)
			continue
		}
		if !bytes.Equal(got, read(t, s)) {
			t.Errorf("%s differs from %s: cp deployments/admission/*.yaml deployments/helm/gputopo/files/admission/", c, s)
		}
	}
	tmpl := string(read(t, filepath.Join(chart, "templates/admission.yaml")))
	for _, s := range src {
		if want := `.Files.Get "files/admission/` + filepath.Base(s) + `"`; !strings.Contains(tmpl, want) {
			t.Errorf("templates/admission.yaml does not render %s (no %s)", filepath.Base(s), want)
		}
	}
}

// The admission policy lets only a requester with the controller's
// permission write the controller's annotations; the chart must grant it
// to the controller.
func TestControllerMayWriteItsAnnotations(t *testing.T) {
	rule := fmt.Sprintf("- apiGroups: [%q]\n  resources: [%q]\n  verbs: [%q]\n",
		placement.ControllerPermissionGroup, placement.ControllerPermissionResource, placement.ControllerPermissionVerb)
	rbac := string(read(t, filepath.Join(chart, "templates/controller/rbac.yaml")))
	role, _, _ := strings.Cut(rbac, "kind: ClusterRoleBinding")
	if !strings.Contains(role, rule) {
		t.Errorf("the controller's ClusterRole in templates/controller/rbac.yaml lacks the rule\n%s", rule)
	}
}

var celExpr = regexp.MustCompile(`(?m)^\s*expression:\s*(.+?)\s*$`)

func TestDeviceClassSelectorMatchesDemo(t *testing.T) {
	demo := celExpr.FindAllStringSubmatch(string(read(t, "../../demo/specs/deviceclass.yaml")), -1)
	tmpl := celExpr.FindAllStringSubmatch(string(read(t, filepath.Join(chart, "templates/deviceclass.yaml"))), -1)
	if len(demo) != 1 || len(tmpl) != 1 {
		t.Fatalf("want one CEL expression each, demo has %d, chart has %d", len(demo), len(tmpl))
	}
	if demo[0][1] != tmpl[0][1] {
		t.Errorf("chart DeviceClass selects %s, demo/specs/deviceclass.yaml selects %s", tmpl[0][1], demo[0][1])
	}
}

type schemaNode struct {
	Type                 any                    `json:"type"`
	Description          string                 `json:"description"`
	Properties           map[string]*schemaNode `json:"properties"`
	Required             []string               `json:"required"`
	AdditionalProperties any                    `json:"additionalProperties"`
}

// Every key of values.yaml is documented by a comment and declared in the
// schema, and every schema property has a default in values.yaml; objects
// with declared properties reject unknown keys (typos fail helm lint).
func TestValuesDocumentedAndInSchema(t *testing.T) {
	var root schemaNode
	if err := json.Unmarshal(read(t, filepath.Join(chart, "values.schema.json")), &root); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(read(t, filepath.Join(chart, "values.yaml")), &doc); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	if len(doc.Content) != 1 {
		t.Fatal("values.yaml: want one document")
	}
	var walk func(path string, m *yaml.Node, s *schemaNode)
	walk = func(path string, m *yaml.Node, s *schemaNode) {
		if m.Kind != yaml.MappingNode {
			t.Errorf("%s: want a mapping in values.yaml", path)
			return
		}
		if s.AdditionalProperties != false {
			t.Errorf("%s: schema must set additionalProperties: false", path)
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			p := strings.TrimPrefix(path+"."+k.Value, ".")
			seen[k.Value] = true
			if strings.TrimSpace(k.HeadComment) == "" {
				t.Errorf("values.yaml:%d: %s has no comment", k.Line, p)
			}
			ps, ok := s.Properties[k.Value]
			if !ok {
				t.Errorf("values.yaml:%d: %s is not in values.schema.json", k.Line, p)
				continue
			}
			if ps.Properties != nil {
				walk(p, v, ps)
			} else if ps.Description == "" {
				t.Errorf("values.schema.json: %s has no description", p)
			}
		}
		var missing []string
		for name := range s.Properties {
			if !seen[name] && !(path == "" && name == "global") {
				missing = append(missing, name)
			}
		}
		sort.Strings(missing)
		for _, name := range missing {
			t.Errorf("values.schema.json declares %s, values.yaml has no default for it", strings.TrimPrefix(path+"."+name, "."))
		}
	}
	walk("", doc.Content[0], &root)
}

// The chart's default label mapping is the binaries' built-in one, so a
// cluster installed with the chart and one without the ConfigMap place
// nodes alike.
func TestLabelMappingDefaultsMatchBinaries(t *testing.T) {
	var values struct {
		LabelMapping struct {
			Leaf, Spine, Core, Clique []string
			TierPrefix                string `yaml:"tierPrefix"`
		} `yaml:"labelMapping"`
	}
	if err := yaml.Unmarshal(read(t, filepath.Join(chart, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	v := values.LabelMapping
	got := topology.LabelMapping{Leaf: v.Leaf, Spine: v.Spine, Core: v.Core, Clique: v.Clique, TierPrefix: v.TierPrefix}
	if diff := cmp.Diff(topology.DefaultLabelMapping(), got); diff != "" {
		t.Errorf("values.yaml labelMapping vs topology.DefaultLabelMapping (-binaries +chart):\n%s", diff)
	}
	tmpl := string(read(t, filepath.Join(chart, "templates/label-mapping.yaml")))
	for k := range topology.DefaultLabelMapping().Data() {
		if !strings.Contains(tmpl, "\n  "+k+": ") {
			t.Errorf("templates/label-mapping.yaml does not write the key %q", k)
		}
	}
}

// The NVML plugin runs only on nodes carrying one of the GPU labels the
// README names.
func TestPluginRunsOnGPUNodes(t *testing.T) {
	ds := string(read(t, filepath.Join(chart, "templates/kubelet-plugin/daemonset.yaml")))
	for _, label := range []string{topology.LabelNVIDIAGPUPresent, topology.LabelNFDNVIDIAPCI} {
		if want := "key: " + label + ", operator: In"; !strings.Contains(ds, want) {
			t.Errorf("templates/kubelet-plugin/daemonset.yaml lacks the node affinity term %q", want)
		}
	}
}
