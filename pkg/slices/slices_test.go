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
	devs := build(t, "dgx-h100", map[string]string{"fabric.topograph.run/tier-0": "leaf-1", "fabric.topograph.run/tier-1": "spine-0",
		"fabric.topograph.run/tier-2": "core-0", "fabric.topograph.run/tier-3": "zone-a"}, nil)
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if diff := cmp.Diff([]string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}, names); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	d := devs[5]
	got := map[string]string{}
	for _, a := range []string{topology.AttrLeaf, topology.AttrSpine, topology.AttrCore, "tier3", topology.AttrNVLinkDomain, topology.AttrNVLinkBlock8, "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/pciBusID"} {
		got[a] = str(d, a)
	}
	want := map[string]string{topology.AttrLeaf: "leaf-1", topology.AttrSpine: "spine-0", topology.AttrCore: "core-0", "tier3": "zone-a", topology.AttrNVLinkDomain: "n1-nvl0",
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
	for _, a := range []string{topology.AttrNVLinkDomain, topology.AttrNVLinkBlock2, topology.AttrLeaf, topology.AttrSpine, topology.AttrCore, topology.AttrNVLinkClique} {
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
	d = build(t, "gb200-nvl72-tray", map[string]string{topology.LabelNVIDIAClique: "rack7.1", topology.LabelTopographDomain: "nvl72-7"}, nil)[0]
	if got := str(d, topology.AttrNVLinkClique); got != "nvl72-7" {
		t.Errorf("topograph's accelerator domain must win over nvidia.com/gpu.clique, got %q", got)
	}
}

// A node labelled by topograph 1.0, by topograph before 1.0, or both, and
// a cluster with a mapping of its own.
func TestNetworkAttributesFromLabels(t *testing.T) {
	custom, err := topology.ParseLabelMapping(map[string]string{"leaf": "example.com/rack", "spine": "example.com/row"})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		mapping topology.LabelMapping
		labels  map[string]string
		want    map[string]string
	}{
		"topograph 1.0": {
			labels: map[string]string{"fabric.topograph.run/tier-0": "leaf-7", "fabric.topograph.run/tier-1": "spine-2"},
			want:   map[string]string{"leaf": "leaf-7", "spine": "spine-2", "core": "<absent>"},
		},
		"before 1.0": {
			labels: map[string]string{"network.topology.nvidia.com/leaf": "sw-l3", "network.topology.nvidia.com/spine": "sw-s1", "network.topology.nvidia.com/core": "sw-c0"},
			want:   map[string]string{"leaf": "sw-l3", "spine": "sw-s1", "core": "sw-c0"},
		},
		"both": {
			labels: map[string]string{"fabric.topograph.run/tier-0": "leaf-7", "network.topology.nvidia.com/leaf": "sw-l3", "network.topology.nvidia.com/spine": "sw-s1"},
			want:   map[string]string{"leaf": "leaf-7", "spine": "sw-s1", "core": "<absent>"},
		},
		"custom mapping": {
			mapping: custom,
			labels:  map[string]string{"example.com/rack": "r12", "example.com/row": "row-b", "fabric.topograph.run/tier-0": "leaf-7"},
			want:    map[string]string{"leaf": "r12", "spine": "row-b", "core": "<absent>"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := slices.DefaultConfig()
			if tc.mapping.Leaf != nil {
				cfg.Network = tc.mapping
			}
			p, _ := sim.LoadBuiltin("dgx-h100")
			devs, err := slices.Devices(p.Inventory("n1"), slices.Node{Name: "n1", Labels: tc.labels}, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range devs {
				got := map[string]string{"leaf": str(d, topology.AttrLeaf), "spine": str(d, topology.AttrSpine), "core": str(d, topology.AttrCore)}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("%s (-want +got):\n%s", d.Name, diff)
				}
			}
		})
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
