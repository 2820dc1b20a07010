package nodepin

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/topology"
)

const attrs = `device.attributes["gpu.gputopo.dev"]`

var expressions = map[string]Pins{
	attrs + `.leaf == "leaf-0"`:                                     {"leaf": "leaf-0"},
	`"leaf-0" == ` + attrs + `.leaf`:                                {"leaf": "leaf-0"},
	attrs + `["spine"] == "spine-1"`:                                {"spine": "spine-1"},
	attrs + `.?leaf.orValue("") == "leaf-0"`:                        {"leaf": "leaf-0"},
	attrs + `.?leaf.orValue("leaf-0") == "leaf-0"`:                  nil, // a device without the attribute passes too
	attrs + `.leaf == "leaf-0" && ` + attrs + `.spine == "spine-0"`: {"leaf": "leaf-0", "spine": "spine-0"},
	attrs + `.leaf == "leaf-0" && device.capacity["gpu.gputopo.dev"].memory.compareTo(quantity("40Gi")) >= 0`: {"leaf": "leaf-0"},
	attrs + `.leaf == "leaf-0" || ` + attrs + `.leaf == "leaf-1"`:                                             nil,
	`!(` + attrs + `.leaf == "leaf-0")`:                                                                       nil,
	attrs + `.leaf != "leaf-0"`:                                                                               nil,
	attrs + `.leaf == "leaf-0" && ` + attrs + `.leaf == "leaf-1"`:                                             nil, // never true
	`device.attributes["other.example.com"].leaf == "leaf-0"`:                                                 nil,
	attrs + `.model == "H100"`:                                                                                nil,
	attrs + `.leaf.startsWith("leaf-0")`:                                                                      nil,
	attrs + `.leaf == ""`:                                                                                     nil,
	`has(` + attrs + `.leaf) && ` + attrs + `.leaf == "leaf-2"`:                                               {"leaf": "leaf-2"},
	`device.driver == "gpu.gputopo.dev"`:                                                                      nil,
	`this is not CEL`:                                                                                         nil,
}

func TestFromExpression(t *testing.T) {
	for expr, want := range expressions {
		got := FromExpression(expr)
		if len(got) == 0 {
			got = nil
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", expr, diff)
		}
	}
}

// Whatever FromExpression says an expression pins, the expression
// evaluated as kube-scheduler evaluates it (the DRA CEL compiler) is
// false on every device that lacks the pinned values: so a node selector
// from the pins never rules out a node whose devices the claim could use.
func TestPinsNeverRuleOutAMatchingDevice(t *testing.T) {
	compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true})
	var devices []dracel.Device
	for _, leaf := range []*string{nil, ptr.To(""), ptr.To("leaf-0"), ptr.To("leaf-1"), ptr.To("leaf-2")} {
		for _, spine := range []*string{nil, ptr.To("spine-0"), ptr.To("spine-1")} {
			d := dracel.Device{Driver: topology.DriverName, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"model": {StringValue: ptr.To("H100")}},
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}}}
			if leaf != nil {
				d.Attributes[topology.AttrLeaf] = resourceapi.DeviceAttribute{StringValue: leaf}
			}
			if spine != nil {
				d.Attributes[topology.AttrSpine] = resourceapi.DeviceAttribute{StringValue: spine}
			}
			devices = append(devices, d)
		}
	}
	for expr := range expressions {
		pins := FromExpression(expr)
		if len(pins) == 0 {
			continue
		}
		prog := compiler.CompileCELExpression(expr, dracel.Options{})
		if prog.Error != nil {
			t.Fatalf("%s: %v", expr, prog.Error)
		}
		matched := 0
		for _, d := range devices {
			ok, _, err := prog.DeviceMatches(context.Background(), d)
			if err != nil || !ok {
				continue // a runtime error selects no device, as in the scheduler
			}
			matched++
			for attr, v := range pins {
				if got := d.Attributes[resourceapi.QualifiedName(attr)].StringValue; got == nil || *got != v {
					t.Errorf("%s pins %s=%s, but matches a device whose %s is %v", expr, attr, v, attr, got)
				}
			}
		}
		if matched == 0 {
			t.Errorf("%s matches no device of the test set: the check proves nothing", expr)
		}
	}
}

func exactly(sel ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gputopo.dev"}}
	for _, s := range sel {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return r
}

func TestFromClaim(t *testing.T) {
	leaf0, leaf1, spine0 := attrs+`.leaf == "leaf-0"`, attrs+`.leaf == "leaf-1"`, attrs+`.spine == "spine-0"`
	alt := func(sels ...[]string) resourceapi.DeviceRequest {
		r := resourceapi.DeviceRequest{Name: "r"}
		for _, ss := range sels {
			sub := resourceapi.DeviceSubRequest{Name: "s", DeviceClassName: "gpu.gputopo.dev"}
			for _, s := range ss {
				sub.Selectors = append(sub.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
			}
			r.FirstAvailable = append(r.FirstAvailable, sub)
		}
		return r
	}
	for name, tc := range map[string]struct {
		requests []resourceapi.DeviceRequest
		want     Pins
	}{
		"count only":                           {requests: []resourceapi.DeviceRequest{exactly()}},
		"one selector":                         {requests: []resourceapi.DeviceRequest{exactly(leaf0)}, want: Pins{"leaf": "leaf-0"}},
		"two selectors of a request":           {requests: []resourceapi.DeviceRequest{exactly(leaf0, spine0)}, want: Pins{"leaf": "leaf-0", "spine": "spine-0"}},
		"two requests":                         {requests: []resourceapi.DeviceRequest{exactly(leaf0), exactly(spine0)}, want: Pins{"leaf": "leaf-0", "spine": "spine-0"}},
		"two requests, two leaves":             {requests: []resourceapi.DeviceRequest{exactly(leaf0), exactly(leaf1)}},
		"one request pins, one does not":       {requests: []resourceapi.DeviceRequest{exactly(leaf0), exactly()}, want: Pins{"leaf": "leaf-0"}},
		"alternatives alike":                   {requests: []resourceapi.DeviceRequest{alt([]string{leaf0, spine0}, []string{leaf0})}, want: Pins{"leaf": "leaf-0"}},
		"alternatives on different leaves":     {requests: []resourceapi.DeviceRequest{alt([]string{leaf0}, []string{leaf1})}},
		"an alternative that pins nothing":     {requests: []resourceapi.DeviceRequest{alt([]string{leaf0}, nil)}},
		"selectors that contradict each other": {requests: []resourceapi.DeviceRequest{exactly(leaf0, leaf1)}},
	} {
		t.Run(name, func(t *testing.T) {
			spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: tc.requests}}
			if diff := cmp.Diff(tc.want, FromClaim(&spec)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestLabelKeys(t *testing.T) {
	m := topology.DefaultLabelMapping()
	topograph := map[string]string{topology.LabelTopographLeaf: "leaf-0", topology.LabelTopographSpine: "spine-0"}
	older := map[string]string{topology.LabelNVIDIALeaf: "leaf-1", topology.LabelNVIDIASpine: "spine-0"}
	both := map[string]string{topology.LabelTopographLeaf: "leaf-2", topology.LabelNVIDIALeaf: "x", topology.LabelTopographSpine: "spine-1"}
	for name, tc := range map[string]struct {
		nodes []map[string]string
		want  map[string]string
	}{
		"topograph labels": {nodes: []map[string]string{topograph, both, {}},
			want: map[string]string{"leaf": topology.LabelTopographLeaf, "spine": topology.LabelTopographSpine}},
		"older labels": {nodes: []map[string]string{older}, want: map[string]string{"leaf": topology.LabelNVIDIALeaf, "spine": topology.LabelNVIDIASpine}},
		// One key cannot select the nodes of both kinds.
		"mixed": {nodes: []map[string]string{topograph, older}, want: map[string]string{}},
		"no labels": {nodes: []map[string]string{{}},
			want: map[string]string{"leaf": topology.LabelTopographLeaf, "spine": topology.LabelTopographSpine}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, LabelKeys(tc.nodes, m)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSelectorFormatParse(t *testing.T) {
	keys := map[string]string{"leaf": "l/key", "spine": "s/key"}
	sel := Selector(Pins{"leaf": "leaf-0", "spine": "spine-1"}, keys)
	if got := Format(sel); got != "l/key=leaf-0,s/key=spine-1" {
		t.Errorf("Format = %q", got)
	}
	back, err := Parse(Format(sel))
	if err != nil || !cmp.Equal(back, sel) {
		t.Errorf("Parse(Format(%v)) = %v, %v", sel, back, err)
	}
	if Selector(Pins{"leaf": "leaf-0"}, map[string]string{"spine": "s/key"}) != nil {
		t.Errorf("a pin whose attribute has no label key must give no selector")
	}
	if _, err := Parse("novalue"); err == nil {
		t.Errorf("Parse accepted a part without =")
	}
}
