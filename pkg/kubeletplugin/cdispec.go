package kubeletplugin

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/topology"
)

// writeSpec writes the CDI spec of a claim's devices and returns the CDI
// device IDs by device name. The same devices and view give the same file.
func (s *state) writeSpec(uid string, devices []checkpoint.PreparedDevice, view *nodeView) (map[string][]string, error) {
	spec := cdi.ClaimSpec{ClaimUID: uid, Driver: s.common}
	var domains, cliques []string
	for _, d := range devices {
		g, ok := view.devices[d.Device]
		if !ok {
			return nil, fmt.Errorf("%w: %s (pool %s)", ErrUnknownDevice, d.Device, d.Pool)
		}
		domain := view.nvlink[d.Device].Domain
		clique := topology.Clique(view.network, g.Fabric)
		e := cdi.DeviceEdits{Name: d.Device, UUID: g.UUID, Env: map[string]string{}}
		// Per-device keys: several claims in one container all keep theirs.
		for prefix, v := range map[string]string{topology.EnvNVLinkDomain: domain, topology.EnvNVLinkClique: clique} {
			if v != "" {
				e.Env[cdi.DeviceEnv(prefix, d.Device)] = v
			}
		}
		if s.driver != nil {
			edits, err := s.driver.Device(g.UUID)
			if err != nil {
				return nil, fmt.Errorf("device %s: %w", d.Device, err)
			}
			e.Edits = edits
		}
		e.Edits = s.mpsEdits(d, e.Edits)
		spec.Devices = append(spec.Devices, e)
		domains = appendUnique(domains, domain)
		cliques = appendUnique(cliques, clique)
	}
	spec.Env = placementEnv(s.node, domains, cliques, view.network)
	// A share's limits go to its containers; real GPUs get MPS limits.
	shares, err := shareEnv(devices, view.devices, s.driver != nil || s.mps != nil)
	if err != nil {
		return nil, err
	}
	maps.Copy(spec.Env, shares)
	if s.mps != nil && hasShare(devices) {
		spec.Env[topology.EnvMPSPipeDirectory] = topology.MPSContainerPipeDir
	}
	ids, err := s.cdi.WriteClaimSpec(spec)
	if err != nil {
		return nil, fmt.Errorf("write CDI spec: %w", err)
	}
	return ids, nil
}

// placementEnv tells the application where its GPUs sit. GPUTOPO_NODE,
// GPUTOPO_LEAF and GPUTOPO_SPINE are the same for every claim on the node;
// the domain and clique lists are the claim's (the per-device variables
// compose when a container has several claims).
func placementEnv(node string, domains, cliques []string, net topology.NetworkPlacement) map[string]string {
	env := map[string]string{topology.EnvNode: node}
	set := func(k, v string) {
		if v != "" {
			env[k] = v
		}
	}
	set(topology.EnvNVLinkDomain, strings.Join(domains, ","))
	set(topology.EnvNVLinkClique, strings.Join(cliques, ","))
	set(topology.EnvLeaf, net.Leaf)
	set(topology.EnvSpine, net.Spine)
	return env
}

func appendUnique(list []string, v string) []string {
	if v == "" || slices.Contains(list, v) {
		return list
	}
	return append(list, v)
}
