package planner

import (
	"fmt"
	"strings"
)

// kube-scheduler's workload-aware scheduling (KEP-4671 and its topology
// follow-up) holds a PodGroup with a topology constraint to one value of
// a node-label key: its TopologyPlacementGenerator makes one placement per
// value, of the nodes that carry it, and the gang is placed in one of
// them or not at all. A plan that spans two values would be refused by
// the scheduler after gputopo had held devices for it, so the planner
// keeps every domain within one value of each of Job.TopologyKeys.

// lacksKey returns the first topology key the node has no label for, or
// "".
func (st *state) lacksKey(nd *node) string {
	for _, k := range st.job.TopologyKeys {
		if _, ok := nd.obj.Labels[k]; !ok {
			return k
		}
	}
	return ""
}

// splitsKey returns the first topology key whose labelled nodes in the
// candidate carry more than one value, with two of those values, or ""
// when the candidate lies within one value of every key. Nodes without
// the label do not count: no pod may use them.
func (st *state) splitsKey(c *candidate) (key, a, b string) {
	if len(st.job.TopologyKeys) == 0 {
		return "", "", ""
	}
	nodes := c.nodes()
	if c.node != nil {
		nodes = []int{c.node.idx}
	}
	for _, k := range st.job.TopologyKeys {
		first := ""
		for _, n := range nodes {
			nd := st.c.nodes[n]
			if nd.gone {
				continue
			}
			v, ok := nd.obj.Labels[k]
			if !ok {
				continue
			}
			if first == "" {
				first = v
			} else if v != first {
				return k, first, v
			}
		}
	}
	return "", "", ""
}

// keepWithinKeys wraps the levels so that only candidates within one
// value of every topology key are offered; it counts, per level label,
// the candidates it left out, so a refusal can say why.
func (st *state) keepWithinKeys(levels []level) []level {
	if len(st.job.TopologyKeys) == 0 {
		return levels
	}
	if st.split == nil {
		st.split = map[string]string{}
	}
	out := make([]level, len(levels))
	for i, lv := range levels {
		inner := lv.cands
		lv.cands = func() []*candidate {
			var keep []*candidate
			for _, c := range inner() {
				if k, a, b := st.splitsKey(c); k != "" {
					if _, seen := st.split[lv.label]; !seen {
						st.split[lv.label] = fmt.Sprintf("%s spans values %s and %s of node label %s", c.dom(), a, b, k)
					}
					continue
				}
				keep = append(keep, c)
			}
			return keep
		}
		out[i] = lv
	}
	return out
}

// keysPhrase names the topology keys for messages.
func (st *state) keysPhrase() string {
	return "node label " + strings.Join(st.job.TopologyKeys, ", ")
}
