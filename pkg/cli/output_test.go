package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/cli"
)

// printed is one command's output in every format.
type printed struct {
	name  string
	print func(format string) (string, error)
	kind  string
}

func printers(t *testing.T) []printed {
	t.Helper()
	f := newFixture(t)
	topo, err := cli.FetchTopology(context.Background(), f.client(), "")
	if err != nil {
		t.Fatal(err)
	}
	e := cli.BuildExplanation("ml/train", f.pods, nil, nil)
	v := cli.VersionOf(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}})
	return []printed{
		{"topology", func(format string) (string, error) {
			var b bytes.Buffer
			err := cli.PrintTopology(&b, topo, format, false)
			return b.String(), err
		}, cli.KindTopology},
		{"explain", func(format string) (string, error) {
			var b bytes.Buffer
			err := cli.PrintExplanation(&b, &e, format, false)
			return b.String(), err
		}, cli.KindExplanation},
		{"version", func(format string) (string, error) {
			var b bytes.Buffer
			err := cli.PrintVersion(&b, v, format)
			return b.String(), err
		}, cli.KindVersion},
	}
}

func TestStructuredOutputsCarryAPIVersionAndKind(t *testing.T) {
	for _, p := range printers(t) {
		for _, format := range []string{cli.OutputJSON, cli.OutputYAML} {
			out, err := p.print(format)
			if err != nil {
				t.Fatalf("%s -o %s: %v", p.name, format, err)
			}
			var got cli.TypeMeta
			if format == cli.OutputJSON {
				err = json.Unmarshal([]byte(out), &got)
			} else {
				err = yaml.Unmarshal([]byte(out), &got)
			}
			if err != nil {
				t.Fatalf("%s -o %s: %v\n%s", p.name, format, err, out)
			}
			if diff := cmp.Diff(cli.TypeMeta{APIVersion: "gputopo.dev/v1alpha1", Kind: p.kind}, got); diff != "" {
				t.Errorf("%s -o %s (-want +got):\n%s", p.name, format, diff)
			}
		}
	}
}

func TestNameJSONPathAndGoTemplateOutputs(t *testing.T) {
	want := map[string]map[string]string{
		"topology": {
			"name":                                 "node/a1\nnode/a2\nnode/b1\n",
			"jsonpath={.kind} {.gpus} {.freeGPUs}": "Topology 24 18",
			`jsonpath={range .nodes[*]}{.name},{end}`:                                     "a1,a2,b1,",
			"go-template={{.apiVersion}} {{range .nodes}}{{.name}}:{{len .gpus}} {{end}}": "gputopo.dev/v1alpha1 a1:8 a2:8 b1:8 ",
			"jsonpath={.missing}": "",
		},
		"explain": {
			"name":                      "pod/solo\npod/train-0\n",
			"jsonpath={.kind} {.group}": "Explanation ml/train",
			"go-template={{range .pods}}{{.name}} {{.state}};{{end}}": "solo placed;train-0 placed;",
		},
		"version": {
			"jsonpath={.version} {.goVersion}":   "v0.3.0 go1.26.8",
			"go-template={{.kind}} {{.version}}": "Version v0.3.0",
		},
	}
	for _, p := range printers(t) {
		got := map[string]string{}
		for format := range want[p.name] {
			out, err := p.print(format)
			if err != nil {
				t.Fatalf("%s -o %s: %v", p.name, format, err)
			}
			got[format] = out
		}
		if diff := cmp.Diff(want[p.name], got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", p.name, diff)
		}
	}
}

func TestCheckOutput(t *testing.T) {
	for _, tc := range []struct {
		format  string
		allowed []string
		err     string
	}{
		{"dot", cli.TopologyOutputs, ""},
		{"name", cli.ExplainOutputs, ""},
		{"jsonpath={.gpus}", cli.TopologyOutputs, ""},
		{"go-template={{.gpus}}", cli.ExplainOutputs, ""},
		{"svg", cli.ExplainOutputs, `unknown output format "svg": want one of table, wide, json, yaml, name, jsonpath=TEMPLATE, go-template=TEMPLATE`},
		{"jsonpath", cli.TopologyOutputs, `output format "jsonpath" needs a template: -o jsonpath=TEMPLATE`},
		{"json=x", cli.TopologyOutputs, `unknown output format "json=x": want one of table, wide, json, yaml, name, jsonpath=TEMPLATE, go-template=TEMPLATE, dot, svg`},
		{"name", cli.VersionOutputs, `unknown output format "name": want one of json, yaml, jsonpath=TEMPLATE, go-template=TEMPLATE`},
		{"jsonpath={.gpus", cli.TopologyOutputs, `parse -o jsonpath template "{.gpus": unclosed action`},
		{"go-template={{.gpus", cli.TopologyOutputs, `parse -o go-template template "{{.gpus"`},
	} {
		err := cli.CheckOutput(tc.format, tc.allowed)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if tc.err == "" && got != "" || !strings.HasPrefix(got, tc.err) {
			t.Errorf("CheckOutput(%q) = %q, want %q", tc.format, got, tc.err)
		}
		if tc.err != "" && got == "" {
			t.Errorf("CheckOutput(%q) passed, want %q", tc.format, tc.err)
		}
	}
}

func TestVersionOf(t *testing.T) {
	info := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/gputopo/gputopo", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "GOOS", Value: "darwin"}, {Key: "GOARCH", Value: "arm64"},
			{Key: "vcs.revision", Value: "b7c2fc1"}, {Key: "vcs.time", Value: "2026-11-23T19:54:10Z"}, {Key: "vcs.modified", Value: "true"},
		},
	}
	want := cli.Version{Version: "v0.3.0", GitCommit: "b7c2fc1", GitTreeState: "dirty", GitCommitTime: "2026-11-23T19:54:10Z", GoVersion: "go1.26.8", Platform: "darwin/arm64"}
	if diff := cmp.Diff(want, cli.VersionOf(info)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	var out bytes.Buffer
	if err := cli.PrintVersion(&out, want, ""); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("Version: v0.3.0\nGit commit: b7c2fc1 (dirty, 2026-11-23T19:54:10Z)\nGo: go1.26.8 darwin/arm64\n", out.String()); diff != "" {
		t.Errorf("text (-want +got):\n%s", diff)
	}
}
