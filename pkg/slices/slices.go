// Package slices turns a node's discovered GPUs and its place in the
// network into the ResourceSlice content gputopo publishes: one pool per
// node, devices in index order, topology attributes on every device.
package slices

import (
	"cmp"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/blang/semver/v4"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Node is what the slice builder needs to know about the node.
type Node struct {
	Name   string
	Labels map[string]string
}

// Config controls how attributes are derived.
type Config struct {
	Network topology.LabelMapping
	// NUMAForm must match the cluster's DRAListTypeAttributes gate.
	NUMAForm deviceattribute.AttributeForm
	// TaintEffect of the unhealthy taint; empty means NoSchedule.
	TaintEffect resourceapi.DeviceTaintEffect
}

// DefaultConfig reads the default label mapping and publishes numaNode as
// a scalar, which every 1.37 cluster accepts.
func DefaultConfig() Config {
	return Config{Network: topology.DefaultLabelMapping(), NUMAForm: deviceattribute.ScalarAttribute, TaintEffect: resourceapi.DeviceTaintEffectNoSchedule}
}

// DeviceName is the name of GPU index in the node's pool.
func DeviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

// Build returns the node's pool. unhealthy maps GPU UUIDs to the event that
// made them unhealthy; those devices carry the unhealthy taint.
func Build(inv *gpu.Inventory, node Node, cfg Config, unhealthy map[string]gpu.HealthEvent) (resourceslice.DriverResources, error) {
	devices, err := Devices(inv, node, cfg, unhealthy)
	if err != nil {
		return resourceslice.DriverResources{}, err
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			node.Name: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}, nil
}

// Devices returns the node's devices in GPU index order.
func Devices(inv *gpu.Inventory, node Node, cfg Config, unhealthy map[string]gpu.HealthEvent) ([]resourceapi.Device, error) {
	nv, err := topology.AnalyzeNVLink(node.Name, inv)
	if err != nil {
		return nil, err
	}
	net := cfg.Network.Resolve(node.Labels)
	order := make([]int, len(inv.Devices))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return inv.Devices[order[a]].Index < inv.Devices[order[b]].Index })

	devices := make([]resourceapi.Device, 0, len(order))
	for _, i := range order {
		d := inv.Devices[i]
		attrs, err := deviceAttributes(d, nv.GPUs[i], net, inv, cfg)
		if err != nil {
			return nil, fmt.Errorf("attributes of GPU %d (%s): %w", d.Index, d.UUID, err)
		}
		dev := resourceapi.Device{
			Name:       DeviceName(d.Index),
			Attributes: attrs,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				topology.CapacityMemory: {Value: *resource.NewQuantity(d.MemoryBytes, resource.BinarySI)},
			},
		}
		if ev, bad := unhealthy[d.UUID]; bad {
			effect := cmp.Or(cfg.TaintEffect, resourceapi.DeviceTaintEffectNoSchedule)
			dev.Taints = []resourceapi.DeviceTaint{{
				Key:    topology.TaintUnhealthy,
				Value:  taintValue(ev.Reason),
				Effect: effect,
			}}
		}
		devices = append(devices, dev)
	}
	return devices, nil
}

func deviceAttributes(d gpu.Device, g topology.GPUPlacement, net topology.NetworkPlacement, inv *gpu.Inventory, cfg Config) (map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	setInt := func(name string, v int64) {
		attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{IntValue: ptr.To(v)}
	}
	setStr := func(name, v string) {
		if v != "" {
			attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		}
	}
	setInt(topology.AttrIndex, int64(d.Index))
	setInt(topology.AttrMinor, int64(d.Minor))
	setStr(topology.AttrUUID, d.UUID)
	setStr(topology.AttrProductName, truncate(d.ProductName))
	setStr(topology.AttrArchitecture, d.Architecture)
	for name, raw := range map[string]string{
		topology.AttrCUDAComputeCapability: d.CUDAComputeCapability,
		topology.AttrDriverVersion:         d.DriverVersion,
		topology.AttrCUDADriverVersion:     d.CUDADriverVersion,
	} {
		if raw == "" {
			continue
		}
		v, err := Version(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}

	setStr(topology.AttrNVLinkDomain, g.Domain)
	for _, size := range topology.BlockSizes {
		setStr(topology.BlockAttr(size), g.Blocks[size])
	}
	setInt(topology.AttrNVLinkPeers, int64(g.Peers))
	setInt(topology.AttrNVLinkLinks, int64(g.Links))
	setInt(topology.AttrNVLinkBandwidthGBps, g.BandwidthGBps)
	setStr(topology.AttrNVLinkClique, truncate(topology.Clique(net, d.Fabric)))
	setStr(topology.AttrLeaf, truncate(net.Leaf))
	setStr(topology.AttrSpine, truncate(net.Spine))
	setStr(topology.AttrCore, truncate(net.Core))
	for _, t := range net.TierNumbers() {
		setStr(topology.TierAttr(t), truncate(net.Tiers[t]))
	}

	var mods []deviceattribute.MachineModifier
	if inv.SysFS != nil {
		mods = append(mods, deviceattribute.WithFS(inv.SysFS))
	}
	if d.PCIBusID != "" {
		bus, err := deviceattribute.GetPCIBusIDAttribute(d.PCIBusID)
		if err != nil {
			return nil, err
		}
		attrs[bus.Name] = bus.Value
		// A GPU behind a virtual bus (VMs) has no resolvable root: publish
		// what is known rather than hiding the GPU.
		if root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(d.PCIBusID, mods...); err == nil {
			attrs[root.Name] = root.Value
		}
	}
	if d.NUMANode >= 0 {
		numa, err := deviceattribute.GetNUMANodeAttribute(d.NUMANode, cfg.NUMAForm, mods...)
		if err != nil {
			return nil, err
		}
		attrs[numa.Name] = numa.Value
	}
	return attrs, nil
}

// Version turns "9.0", "12.4" or "535.183.01" into the semantic version a
// version attribute needs ("9.0.0", "12.4.0", "535.183.1").
func Version(raw string) (string, error) {
	parts := strings.Split(strings.TrimSpace(raw), ".")
	if len(parts) < 1 || len(parts) > 3 {
		return "", fmt.Errorf("version %q: want 1 to 3 dot-separated numbers", raw)
	}
	nums := []uint64{0, 0, 0}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return "", fmt.Errorf("version %q: %q is not a number", raw, p)
		}
		nums[i] = n
	}
	v := semver.Version{Major: nums[0], Minor: nums[1], Patch: nums[2]}
	return v.String(), nil
}

var taintValueRE = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// taintValue makes a health reason fit a taint value (a label value).
func taintValue(reason string) string {
	v := taintValueRE.ReplaceAllString(reason, "-")
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "-._")
}

// truncate keeps a string attribute within the API's 64-character limit.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
