package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/topology"
)

func (f fixture) client(extra ...runtime.Object) *fake.Clientset {
	var objs []runtime.Object
	for i := range f.nodes {
		objs = append(objs, &f.nodes[i])
	}
	for i := range f.slices {
		objs = append(objs, &f.slices[i])
	}
	for i := range f.claims {
		objs = append(objs, &f.claims[i])
	}
	for i := range f.pods {
		objs = append(objs, &f.pods[i])
	}
	return fake.NewClientset(append(objs, extra...)...)
}

func TestFetchTopologyJSON(t *testing.T) {
	f := newFixture(t)
	mapping := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "gputopo", Name: topology.LabelMappingConfigMap},
		Data: map[string]string{"leaf": "example.com/rack"}}
	f.nodes[0].Labels["example.com/rack"] = "rack-9"
	topo, err := cli.FetchTopology(context.Background(), f.client(mapping), "")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := cli.PrintTopology(&out, topo, cli.OutputJSON, false); err != nil {
		t.Fatal(err)
	}
	// What a script reading `kubectl gputopo topology -o json` relies on.
	var parsed struct {
		LabelMapping struct {
			Source string   `json:"source"`
			Leaf   []string `json:"leaf"`
		} `json:"labelMapping"`
		GPUs, FreeGPUs int
		Nodes          []struct {
			Name, Spine, Leaf string
			GPUs              []struct{ Name, State, Holder string }
		}
	}
	if err := json.Unmarshal(out.Bytes(), &parsed); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out.String())
	}
	if parsed.LabelMapping.Source != "gputopo/"+topology.LabelMappingConfigMap || !cmp.Equal(parsed.LabelMapping.Leaf, []string{"example.com/rack"}) {
		t.Errorf("labelMapping = %+v", parsed.LabelMapping)
	}
	if parsed.GPUs != 24 || parsed.FreeGPUs != 18 || len(parsed.Nodes) != 3 {
		t.Errorf("gpus %d free %d nodes %d, want 24, 18, 3", parsed.GPUs, parsed.FreeGPUs, len(parsed.Nodes))
	}
	if n := parsed.Nodes[0]; n.Name != "a1" || n.Leaf != "rack-9" || n.GPUs[4].State != "allocated" || n.GPUs[4].Holder != "ml/train" {
		t.Errorf("first node %+v", n)
	}
}

func TestFetchTopologyErrors(t *testing.T) {
	noSlices := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	if _, err := cli.FetchTopology(context.Background(), noSlices, ""); !errors.Is(err, cli.ErrNotInstalled) {
		t.Errorf("no gputopo slices: err = %v, want ErrNotInstalled", err)
	}
	unreachable, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cli.FetchTopology(context.Background(), unreachable, "")
	if !errors.Is(err, cli.ErrNoCluster) || !strings.Contains(err.Error(), "--context") {
		t.Errorf("unreachable API server: err = %v, want ErrNoCluster naming --context", err)
	}
}

func TestFetchExplanationFindsJobOrSaysWhatToDo(t *testing.T) {
	f := newFixture(t)
	job := func(ns, name string) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	grouped := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "g-0", Annotations: map[string]string{placement.AnnotationGroup: "sweep"}}}
	c := f.client(job("ml", "train"), job("a", "twin"), job("b", "twin"), grouped)
	ctx := context.Background()

	e, err := cli.FetchExplanation(ctx, c, "default", true, cli.Target{Name: "train"})
	if err != nil || e.Group != "ml/train" || len(e.Pods) != 1 {
		t.Errorf("-A train: %+v, %v; want ml/train with its pod", e, err)
	}
	if e, err := cli.FetchExplanation(ctx, c, "team", false, cli.Target{Name: "sweep"}); err != nil || len(e.Pods) != 1 || e.Pods[0].Name != "g-0" {
		t.Errorf("group sweep: %+v, %v", e, err)
	}
	if _, err := cli.FetchExplanation(ctx, c, "default", false, cli.Target{Name: "train"}); !errors.Is(err, cli.ErrNotFound) || !strings.Contains(err.Error(), "-A") {
		t.Errorf("train in the wrong namespace: err = %v, want ErrNotFound suggesting -A", err)
	}
	if _, err := cli.FetchExplanation(ctx, c, "", true, cli.Target{Name: "twin"}); !errors.Is(err, cli.ErrAmbiguous) || !strings.Contains(err.Error(), "a, b") {
		t.Errorf("-A twin: err = %v, want ErrAmbiguous naming a and b", err)
	}
	if _, err := cli.FetchExplanation(ctx, c, "", true, cli.Target{Name: "nothing"}); !errors.Is(err, cli.ErrNotFound) {
		t.Errorf("-A nothing: err = %v, want ErrNotFound", err)
	}
}

func TestOutputFormats(t *testing.T) {
	if err := cli.CheckOutput("svg", cli.ExplainOutputs); err == nil || !strings.Contains(err.Error(), "table, wide, json, yaml") {
		t.Errorf("explain -o svg: %v", err)
	}
	if err := cli.CheckOutput("dot", cli.TopologyOutputs); err != nil {
		t.Error(err)
	}
}

// The SVG is well-formed XML with one square per GPU, coloured by state
// and holder, and a legend entry per holder.
func TestRenderSVG(t *testing.T) {
	views := newFixture(t).views()
	var out bytes.Buffer
	if err := cli.RenderSVG(&out, views, nil); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(out.Bytes()))
	titles := map[string]int{}
	var inTitle bool
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inTitle = tok.Name.Local == "title"
		case xml.CharData:
			if inTitle {
				s := string(tok)
				switch {
				case strings.Contains(s, ": free"):
					titles["free"]++
				case strings.Contains(s, ": allocated by ml/train"):
					titles["train"]++
				case strings.Contains(s, ": allocated by ml/solo"):
					titles["solo"]++
				case strings.Contains(s, ": unhealthy"):
					titles["unhealthy"]++
				case strings.HasPrefix(s, "NVLink domain"):
					titles["domain"]++
				}
			}
		case xml.EndElement:
			inTitle = false
		}
	}
	// a1: one cube-mesh domain; a2: four bridged pairs; b1: none.
	want := map[string]int{"free": 18, "train": 4, "solo": 1, "unhealthy": 1, "domain": 5}
	if diff := cmp.Diff(want, titles); diff != "" {
		t.Errorf("GPU squares and NVLink frames (-want +got):\n%s", diff)
	}
	for _, s := range []string{">ml/train</text>", ">ml/solo</text>", ">core-0</text>", ">spine-0</text>", ">leaf-0 · 12/16 free</text>", ">leaf-1 · 6/8 free</text>"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("SVG lacks %s", s)
		}
	}
}

func TestRenderDOT(t *testing.T) {
	var out bytes.Buffer
	if err := cli.RenderDOT(&out, newFixture(t).views()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"core/core-0" -> "spine/spine-0";`, `"spine/spine-0" -> "leaf/spine-0/leaf-0";`, `"leaf/spine-0/leaf-1" -> "node/b1";`, `TOOLTIP="gpu-7: unhealthy (XID-79)"`, ">ml/train</TD>"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("DOT lacks %s:\n%s", s, out.String())
		}
	}
	if strings.Count(out.String(), "{") != strings.Count(out.String(), "}") {
		t.Error("unbalanced braces")
	}
}
