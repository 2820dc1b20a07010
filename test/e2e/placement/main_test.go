package placement

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// namespace holds every Job the suite creates.
const namespace = "gputopo-placement"

// The suite's cluster, started once by TestMain, and its shape as the API
// serves it.
var (
	suite  *framework.Suite
	lc     *cluster.Cluster
	client kubernetes.Interface
	topo   topology
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, framework.Options{
		Name:       "placement",
		Topology:   filepath.Join("testdata", "topology.yaml"),
		Namespace:  namespace,
		Controller: true,
		// -v=4 adds the leader election's steps to the controller's log.
		ControllerArgs: []string{"-v=4"},
		Manifests:      []string{filepath.Join("deployments", "admission")},
	}, func(s *framework.Suite) error {
		suite, lc, client = s, s.Cluster, s.Client
		var err error
		topo, err = loadTopology(context.Background())
		return err
	}))
}

// topology is the network tree as the nodes' labels say, with leaves in
// the order of the topology file under each spine (which is also the
// natural order of their names, the controller's adjacency).
type topology struct {
	leafOf      map[string]string   // node → leaf
	spineOf     map[string]string   // leaf → spine
	leafNodes   map[string][]string // leaf → its nodes
	spineLeaves map[string][]string // spine → its leaves, in order
	leaves      []string            // every leaf, in order
	real        map[string]bool     // nodes with a kubelet
}

func loadTopology(ctx context.Context) (topology, error) {
	t := topology{leafOf: map[string]string{}, spineOf: map[string]string{}, leafNodes: map[string][]string{},
		spineLeaves: map[string][]string{}, real: map[string]bool{}}
	for _, spec := range suite.Nodes {
		n, err := client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			return t, err
		}
		leaf, spine := n.Labels[cluster.LabelLeaf], n.Labels[cluster.LabelSpine]
		if leaf == "" || spine == "" {
			return t, fmt.Errorf("node %s has no leaf or spine label: %v", n.Name, n.Labels)
		}
		t.leafOf[n.Name] = leaf
		if _, seen := t.spineOf[leaf]; !seen {
			t.spineOf[leaf] = spine
			t.spineLeaves[spine] = append(t.spineLeaves[spine], leaf)
			t.leaves = append(t.leaves, leaf)
		}
		t.leafNodes[leaf] = append(t.leafNodes[leaf], n.Name)
		t.real[n.Name] = spec.Real
	}
	return t, nil
}
