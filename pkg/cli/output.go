package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Output formats of -o.
const (
	OutputTable = "table"
	OutputWide  = "wide"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
	OutputDOT   = "dot"
	OutputSVG   = "svg"
)

// TopologyOutputs and ExplainOutputs are what -o accepts per command.
var (
	TopologyOutputs = []string{OutputTable, OutputWide, OutputJSON, OutputYAML, OutputDOT, OutputSVG}
	ExplainOutputs  = []string{OutputTable, OutputWide, OutputJSON, OutputYAML}
)

// CheckOutput reports an -o value the command does not know.
func CheckOutput(format string, allowed []string) error {
	if slices.Contains(allowed, format) {
		return nil
	}
	return fmt.Errorf("unknown output format %q: want one of %s", format, strings.Join(allowed, ", "))
}

// PrintTopology writes t in format; color applies to table and wide.
func PrintTopology(w io.Writer, t *Topology, format string, color bool) error {
	switch format {
	case OutputJSON, OutputYAML:
		return printData(w, t, format)
	case OutputDOT:
		return RenderDOT(w, t.Nodes)
	case OutputSVG:
		return RenderSVG(w, t.Nodes)
	}
	return RenderTree(w, t.Nodes, TreeOptions{Wide: format == OutputWide, Color: color})
}

// PrintExplanation writes e in format.
func PrintExplanation(w io.Writer, e *Explanation, format string, color bool) error {
	switch format {
	case OutputJSON, OutputYAML:
		return printData(w, e, format)
	}
	return RenderExplanation(w, *e, TreeOptions{Wide: format == OutputWide, Color: color})
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
