package peers

import (
	"maps"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/pkg/topology"
)

// LeaderWorkerSet's labels, as its controller writes them on pods.
const (
	lwsName        = "leaderworkerset.sigs.k8s.io/name"
	lwsGroupIndex  = "leaderworkerset.sigs.k8s.io/group-index"
	lwsWorkerIndex = "leaderworkerset.sigs.k8s.io/worker-index"
)

// TestLeaderWorkerSetGroupsInOneLeafInRankOrder: the real LeaderWorkerSet
// controller makes two replica groups of a leader and three workers
// (testdata/lws.yaml, whole-node pods); gputopo places each group in a leaf
// of its own, the group's claims allocated for that group, and its pods in
// worker-index order over the leaf's nodes (rank 0, the leader, on the
// leaf's first node).
func TestLeaderWorkerSetGroupsInOneLeafInRankOrder(t *testing.T) {
	lws := create(t, readObjects(t, "lws.yaml")[0])
	pods := waitBound(t, lwsName+"="+lws.GetName(), 8)
	groups := map[string][]corev1.Pod{}
	for _, p := range pods {
		groups[p.Labels[lwsGroupIndex]] = append(groups[p.Labels[lwsGroupIndex]], p)
	}
	if len(groups) != 2 {
		t.Fatalf("pods in groups %v, want groups 0 and 1", slices.Collect(maps.Keys(groups)))
	}
	leaves := map[string]string{}
	for idx, g := range groups {
		leaf := oneLeaf(t, g)
		if other, ok := leaves[leaf]; ok {
			t.Errorf("groups %s and %s share %s; each needs a whole leaf", other, idx, leaf)
		}
		leaves[leaf] = idx
		checkClaims(t, g, namespace+"/lws/"+lws.GetName()+"-"+idx)
		rank := func(p corev1.Pod) int { n, _ := strconv.Atoi(p.Labels[lwsWorkerIndex]); return n }
		slices.SortFunc(g, func(a, b corev1.Pod) int { return rank(a) - rank(b) })
		var nodes []string
		for i, p := range g {
			if rank(p) != i {
				t.Fatalf("group %s: worker indexes %v, want 0..3", idx, g)
			}
			nodes = append(nodes, p.Spec.NodeName)
		}
		if !slices.IsSortedFunc(nodes, func(a, b string) int {
			switch {
			case topology.NaturalLess(a, b):
				return -1
			case topology.NaturalLess(b, a):
				return 1
			}
			return 0
		}) {
			t.Errorf("group %s: nodes by worker index %v, want them in the leaf's order", idx, nodes)
		}
		t.Logf("group %s in %s: nodes by worker index %v", idx, leaf, nodes)
	}
}
