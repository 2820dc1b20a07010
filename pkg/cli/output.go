package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"
)

// Output formats of -o. OutputJSONPath and OutputGoTemplate take their
// template after "=", as kubectl's do.
const (
	OutputTable      = "table"
	OutputWide       = "wide"
	OutputJSON       = "json"
	OutputYAML       = "yaml"
	OutputName       = "name"
	OutputJSONPath   = "jsonpath"
	OutputGoTemplate = "go-template"
	OutputDOT        = "dot"
	OutputSVG        = "svg"
)

// APIVersion and the kinds that -o json, yaml, jsonpath and go-template
// carry in apiVersion and kind.
const (
	APIVersion      = "gputopo.dev/v1alpha1"
	KindTopology    = "Topology"
	KindExplanation = "Explanation"
	KindVersion     = "Version"
)

// TypeMeta says what a structured output is: apiVersion and kind.
type TypeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// TopologyOutputs, ExplainOutputs and VersionOutputs are what -o accepts
// per command.
var (
	TopologyOutputs = []string{OutputTable, OutputWide, OutputJSON, OutputYAML, OutputName, OutputJSONPath, OutputGoTemplate, OutputDOT, OutputSVG}
	ExplainOutputs  = []string{OutputTable, OutputWide, OutputJSON, OutputYAML, OutputName, OutputJSONPath, OutputGoTemplate}
	VersionOutputs  = []string{OutputJSON, OutputYAML, OutputJSONPath, OutputGoTemplate}
)

// templated says whether -o format takes a template after "=".
func templated(format string) bool {
	return format == OutputJSONPath || format == OutputGoTemplate
}

// OutputsHelp lists formats for a flag's help and errors, a template
// format as FORMAT=TEMPLATE.
func OutputsHelp(formats []string) string {
	var out []string
	for _, f := range formats {
		if templated(f) {
			f += "=TEMPLATE"
		}
		out = append(out, f)
	}
	return strings.Join(out, ", ")
}

// CheckOutput reports an -o value the command does not know, or a
// template that does not parse.
func CheckOutput(format string, allowed []string) error {
	name, tmpl, hasTemplate := strings.Cut(format, "=")
	if !slices.Contains(allowed, name) || hasTemplate != templated(name) {
		if !hasTemplate && templated(name) && slices.Contains(allowed, name) {
			return fmt.Errorf("output format %q needs a template: -o %s=TEMPLATE", format, name)
		}
		return fmt.Errorf("unknown output format %q: want one of %s", format, OutputsHelp(allowed))
	}
	if hasTemplate {
		_, err := templatePrinter(name, tmpl)
		return err
	}
	return nil
}

// templatePrinter parses a jsonpath or go-template template. Missing keys
// print nothing, as kubectl's --allow-missing-template-keys does by
// default.
func templatePrinter(format, tmpl string) (printers.ResourcePrinter, error) {
	if format == OutputJSONPath {
		p, err := printers.NewJSONPathPrinter(tmpl)
		if err != nil {
			return nil, fmt.Errorf("parse -o jsonpath template %q: %w", tmpl, err)
		}
		p.AllowMissingKeys(true)
		return p, nil
	}
	p, err := printers.NewGoTemplatePrinter([]byte(tmpl))
	if err != nil {
		return nil, fmt.Errorf("parse -o go-template template %q: %w", tmpl, err)
	}
	p.AllowMissingKeys(true)
	return p, nil
}

// PrintTopology writes t in format; color applies to table and wide.
// -o name lists the nodes.
func PrintTopology(w io.Writer, t *Topology, format string, color bool) error {
	switch format {
	case OutputDOT:
		return RenderDOT(w, t.Nodes)
	case OutputSVG:
		return RenderSVG(w, t.Nodes, t.Waiting)
	case OutputTable, OutputWide:
		return RenderTree(w, t.Nodes, TreeOptions{Wide: format == OutputWide, Color: color, Waiting: t.Waiting})
	}
	v := *t
	v.TypeMeta = TypeMeta{APIVersion: APIVersion, Kind: KindTopology}
	var names []string
	for _, n := range t.Nodes {
		names = append(names, "node/"+n.Name)
	}
	return printObject(w, &v, format, names)
}

// PrintExplanation writes e in format. -o name lists the pods.
func PrintExplanation(w io.Writer, e *Explanation, format string, color bool) error {
	if format == OutputTable || format == OutputWide {
		return RenderExplanation(w, *e, TreeOptions{Wide: format == OutputWide, Color: color})
	}
	v := *e
	v.TypeMeta = TypeMeta{APIVersion: APIVersion, Kind: KindExplanation}
	var names []string
	for _, p := range e.Pods {
		names = append(names, "pod/"+p.Name)
	}
	return printObject(w, &v, format, names)
}

// printObject writes v, which carries its TypeMeta, in a structured
// format; names are what -o name lists.
func printObject(w io.Writer, v any, format string, names []string) error {
	name, tmpl, _ := strings.Cut(format, "=")
	switch name {
	case OutputJSON, OutputYAML:
		return printData(w, v, name)
	case OutputName:
		for _, n := range names {
			if _, err := fmt.Fprintln(w, n); err != nil {
				return err
			}
		}
		return nil
	case OutputJSONPath, OutputGoTemplate:
		p, err := templatePrinter(name, tmpl)
		if err != nil {
			return err
		}
		data, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode for -o %s: %w", name, err)
		}
		obj := &unstructured.Unstructured{}
		// utiljson keeps whole numbers integers, so templates print 8, not 8e+00.
		if err := utiljson.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("decode for -o %s: %w", name, err)
		}
		return p.PrintObj(obj, w)
	}
	return fmt.Errorf("unknown output format %q", format)
}

func printData(w io.Writer, v any, format string) error {
	var data []byte
	var err error
	if format == OutputYAML {
		data, err = yaml.Marshal(v)
	} else {
		data, err = json.MarshalIndent(v, "", "  ")
		data = append(data, '\n')
	}
	if err != nil {
		return fmt.Errorf("encode %s: %w", format, err)
	}
	_, err = w.Write(data)
	return err
}
