package slices_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

func build(t *testing.T, profile string, labels map[string]string, unhealthy map[string]gpu.HealthEvent) []resourceapi.Device {
	t.Helper()
	p, err := sim.LoadBuiltin(profile)
	if err != nil {
		t.Fatal(err)
	}
	res, err := slices.Build(p.Inventory("n1"), slices.Node{Name: "n1", Labels: labels}, slices.DefaultConfig(), unhealthy)
	if err != nil {
		t.Fatal(err)
	}
	objs := slices.Objects("n1", res)
	if len(objs) != 1 || objs[0].Spec.Pool.Name != "n1" || *objs[0].Spec.NodeName != "n1" || objs[0].Spec.Driver != topology.DriverName {
		t.Fatalf("want one slice for pool n1, got %+v", objs)
	}
	return objs[0].Spec.Devices
}

func str(d resourceapi.Device, name string) string {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return "<absent>"
}

func TestDevicesAreOrderedAndComplete(t *testing.T) {
	devs := build(t, "dgx-h100", map[string]string{topology.LabelTopographLeaf: "leaf-1", topology.LabelTopographSpine: "spine-0", topology.LabelTopographTierPrefix + "3": "core"}, nil)
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if diff := cmp.Diff([]string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}, names); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	d := devs[5]
	got := map[string]string{}
	for _, a := range []string{topology.AttrLeaf, topology.AttrSpine, "tier3", topology.AttrNVLinkDomain, topology.AttrNVLinkBlock8, "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/pciBusID"} {
		got[a] = str(d, a)
	}
	want := map[string]string{topology.AttrLeaf: "leaf-1", topology.AttrSpine: "spine-0", "tier3": "core", topology.AttrNVLinkDomain: "n1-nvl0",
		topology.AttrNVLinkBlock8: "n1-b8-0", "resource.kubernetes.io/pcieRoot": "pci0000:80", "resource.kubernetes.io/pciBusID": "0000:82:00.0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("attributes of gpu-5 (-want +got):\n%s", diff)
	}
	if v := *d.Attributes[topology.AttrCUDAComputeCapability].VersionValue; v != "9.0.0" {
		t.Errorf("compute capability %q", v)
	}
	if n := *d.Attributes["resource.kubernetes.io/numaNode"].IntValue; n != 1 {
		t.Errorf("numaNode of gpu-5 = %d, want 1", n)
	}
	if m := d.Capacity[topology.CapacityMemory].Value; m.String() != "80Gi" {
		t.Errorf("memory %s", m.String())
	}
}

func TestAbsentAttributes(t *testing.T) {
	d := build(t, "pcie-only", nil, nil)[0]
	for _, a := range []string{topology.AttrNVLinkDomain, topology.AttrNVLinkBlock2, topology.AttrLeaf, topology.AttrSpine, topology.AttrNVLinkClique} {
		if s := str(d, a); s != "<absent>" {
			t.Errorf("%s = %q on an unlabelled PCIe-only node, want absent", a, s)
		}
	}
}

func TestCliqueFromFabricAndLabel(t *testing.T) {
	d := build(t, "gb200-nvl72-tray", nil, nil)[0]
	if got := str(d, topology.AttrNVLinkClique); got != "5c1d2b9e-7a4f-4e61-9b0a-1f2e3d4c5b6a.1" {
		t.Errorf("clique from fabric = %q", got)
	}
	d = build(t, "gb200-nvl72-tray", map[string]string{topology.LabelNVIDIAClique: "rack7.1"}, nil)[0]
	if got := str(d, topology.AttrNVLinkClique); got != "rack7.1" {
		t.Errorf("clique label must win, got %q", got)
	}
}

func TestUnhealthyTaintValueIsSanitised(t *testing.T) {
	p, _ := sim.LoadBuiltin("pcie-only")
	uuid := p.Inventory("n1").Devices[1].UUID
	devs := build(t, "pcie-only", nil, map[string]gpu.HealthEvent{uuid: {UUID: uuid, Reason: "XID 79: fell off the bus"}})
	want := []resourceapi.DeviceTaint{{Key: topology.TaintUnhealthy, Value: "XID-79--fell-off-the-bus", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if diff := cmp.Diff(want, devs[1].Taints); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestVersion(t *testing.T) {
	for in, want := range map[string]string{"9.0": "9.0.0", "12": "12.0.0", "535.183.01": "535.183.1", "550.54.15": "550.54.15"} {
		if got, err := slices.Version(in); err != nil || got != want {
			t.Errorf("Version(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "r550", "1.2.3.4", "9.x"} {
		if _, err := slices.Version(bad); err == nil {
			t.Errorf("Version(%q) must fail", bad)
		}
	}
}
