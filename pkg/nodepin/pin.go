// Package nodepin finds what a ResourceClaim's CEL selectors pin about
// where its devices are, in terms of node labels, so that a pod can carry
// the same constraint as a node selector: kube-scheduler then filters nodes
// by label, which costs next to nothing, before it runs the DRA allocator,
// which evaluates the CEL on every device of every node it tries.
//
// A selector pins a tier when one of its top-level conjuncts is an
// equality between a string and gputopo's leaf or spine attribute, e.g.
//
//	device.attributes["gpu.gputopo.dev"].leaf == "leaf-0"
//	device.attributes["gpu.gputopo.dev"].?leaf.orValue("") == "leaf-0"
//	"spine-1" == device.attributes["gpu.gputopo.dev"]["spine"]
//
// Anything else pins nothing, so the node selector never excludes a node
// the claim could use: it is the CEL's consequence, not a replacement.
// The claim is left as the user wrote it.
package nodepin

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/parser"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/topology"
)

// Pins are tier attribute → the value a claim's devices must have.
type Pins map[string]string

// Attributes are the attributes a pin can be on, each published from a
// node label by the kubelet plugin.
var Attributes = []string{topology.AttrLeaf, topology.AttrSpine}

// FromClaim returns what spec pins. A request pins what every one of its
// selectors pins (they all apply); a request with alternatives
// (firstAvailable) only what all alternatives pin alike. Requests that
// pin one attribute to different values make the claim unsatisfiable on
// any one node: FromClaim then returns nil, and the scheduler says why.
func FromClaim(spec *resourceapi.ResourceClaimSpec) Pins {
	out := Pins{}
	for _, r := range spec.Devices.Requests {
		var p Pins
		switch {
		case r.Exactly != nil:
			p = fromSelectors(r.Exactly.Selectors)
		case len(r.FirstAvailable) > 0:
			for i, sub := range r.FirstAvailable {
				sp := fromSelectors(sub.Selectors)
				if i == 0 {
					p = sp
					continue
				}
				maps.DeleteFunc(p, func(k, v string) bool { return sp[k] != v })
			}
		}
		for k, v := range p {
			if old, ok := out[k]; ok && old != v {
				return nil
			}
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func fromSelectors(sels []resourceapi.DeviceSelector) Pins {
	out := Pins{}
	for _, s := range sels {
		if s.CEL == nil {
			continue
		}
		for k, v := range FromExpression(s.CEL.Expression) {
			if old, ok := out[k]; ok && old != v {
				// Never true: no device passes. Pin nothing and let
				// the scheduler say so.
				return Pins{}
			}
			out[k] = v
		}
	}
	return out
}

var celParser = func() *parser.Parser {
	p, err := parser.NewParser(parser.EnableOptionalSyntax(true), parser.Macros(parser.AllMacros...))
	if err != nil {
		panic(err)
	}
	return p
}()

// FromExpression returns what one CEL selector pins; nothing for an
// expression it cannot parse (the API server refuses those anyway).
func FromExpression(expr string) Pins {
	parsed, errs := celParser.Parse(common.NewTextSource(expr))
	if errs != nil && len(errs.GetErrors()) > 0 {
		return nil
	}
	out := Pins{}
	var walk func(e ast.Expr)
	walk = func(e ast.Expr) {
		if e.Kind() != ast.CallKind {
			return
		}
		call := e.AsCall()
		switch call.FunctionName() {
		case operators.LogicalAnd:
			for _, a := range call.Args() {
				walk(a)
			}
		case operators.Equals:
			a, b := call.Args()[0], call.Args()[1]
			for _, side := range [][2]ast.Expr{{a, b}, {b, a}} {
				attr, dflt, ok := tierAttribute(side[0])
				if !ok || side[1].Kind() != ast.LiteralKind {
					continue
				}
				// A device without the attribute reads as dflt: the
				// equality pins only a value other than it.
				if s, ok := side[1].AsLiteral().Value().(string); ok && s != "" && (dflt == nil || *dflt != s) {
					if old, seen := out[attr]; seen && old != s {
						out = Pins{"": ""} // never true
						return
					}
					out[attr] = s
				}
			}
		}
	}
	walk(parsed.Expr())
	if _, never := out[""]; never {
		return Pins{}
	}
	return out
}

// tierAttribute recognises gputopo's leaf or spine attribute of the
// device, read as device.attributes["<driver>"].<attr>,
// device.attributes["<driver>"]["<attr>"], or
// device.attributes["<driver>"].?<attr>.orValue("<default>"); dflt is
// the default of the last form, nil otherwise.
func tierAttribute(e ast.Expr) (attr string, dflt *string, ok bool) {
	switch e.Kind() {
	case ast.SelectKind:
		s := e.AsSelect()
		if s.IsTestOnly() {
			return "", nil, false
		}
		attr, ok = tierOf(s.Operand(), s.FieldName())
		return attr, nil, ok
	case ast.CallKind:
	default:
		return "", nil, false
	}
	call := e.AsCall()
	switch {
	case call.FunctionName() == operators.Index && len(call.Args()) == 2:
		name, _ := literalString(call.Args()[1])
		attr, ok = tierOf(call.Args()[0], name)
		return attr, nil, ok
	case call.FunctionName() == "orValue" && call.IsMemberFunction() && len(call.Args()) == 1:
		d, isString := literalString(call.Args()[0])
		t := call.Target()
		if !isString || t.Kind() != ast.CallKind || t.AsCall().FunctionName() != operators.OptSelect || len(t.AsCall().Args()) != 2 {
			return "", nil, false
		}
		name, _ := literalString(t.AsCall().Args()[1])
		attr, ok = tierOf(t.AsCall().Args()[0], name)
		return attr, &d, ok
	}
	return "", nil, false
}

func literalString(e ast.Expr) (string, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().Value().(string)
	return s, ok
}

// tierOf reports whether operand is device.attributes["<driver>"] and
// name one of Attributes.
func tierOf(operand ast.Expr, name string) (string, bool) {
	if !slices.Contains(Attributes, name) || operand.Kind() != ast.CallKind {
		return "", false
	}
	call := operand.AsCall()
	if call.FunctionName() != operators.Index || len(call.Args()) != 2 {
		return "", false
	}
	if d, _ := literalString(call.Args()[1]); d != topology.DriverName {
		return "", false
	}
	m := call.Args()[0]
	if m.Kind() != ast.SelectKind || m.AsSelect().FieldName() != "attributes" || m.AsSelect().IsTestOnly() {
		return "", false
	}
	dev := m.AsSelect().Operand()
	if dev.Kind() != ast.IdentKind || dev.AsIdent() != "device" {
		return "", false
	}
	return name, true
}

// LabelKeys is, for each of Attributes, the one node label it is published
// from on every node that has it under mapping; an attribute that nodes
// take from different labels has none, since one label key could not
// select the same nodes as the attribute.
func LabelKeys(nodeLabels []map[string]string, mapping topology.LabelMapping) map[string]string {
	candidates := map[string][]string{topology.AttrLeaf: mapping.Leaf, topology.AttrSpine: mapping.Spine}
	out := map[string]string{}
	for attr, keys := range candidates {
		used := map[string]bool{}
		for _, l := range nodeLabels {
			for _, k := range keys {
				if v, ok := l[k]; ok && v != "" {
					used[k] = true
					break
				}
			}
		}
		switch len(used) {
		case 0:
			if len(keys) > 0 {
				out[attr] = keys[0] // no node has it: the first label selects none, as the attribute does
			}
		case 1:
			for k := range used {
				out[attr] = k
			}
		}
	}
	return out
}

// Selector is the node selector that pins p with keys (LabelKeys):
// nil when one of p's attributes has no key.
func Selector(p Pins, keys map[string]string) map[string]string {
	if len(p) == 0 {
		return nil
	}
	out := map[string]string{}
	for attr, v := range p {
		k, ok := keys[attr]
		if !ok {
			return nil
		}
		out[k] = v
	}
	return out
}

// ConfigMapName is the ConfigMap the controller keeps in each namespace
// whose claims or claim templates pin a tier; the
// gputopo-claim-node-selector MutatingAdmissionPolicy reads it, as its
// parameters, for every pod created in that namespace.
const ConfigMapName = "gputopo-claim-node-selectors"

// Keys of ConfigMapName's data: a template's or a claim's name after
// this prefix.
const (
	TemplateKeyPrefix = "template."
	ClaimKeyPrefix    = "claim."
)

// Format writes a node selector as ConfigMapName holds it:
// "key=value[,key=value...]", keys sorted.
func Format(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + sel[k]
	}
	return strings.Join(parts, ",")
}

// Parse reads what Format writes.
func Parse(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("node selector %q: %q is not key=value", s, part)
		}
		out[k] = v
	}
	return out, nil
}
