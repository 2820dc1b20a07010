package native

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"

	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

const namespace = "gputopo-native"

var (
	suite  *framework.Suite
	lc     *cluster.Cluster
	client kubernetes.Interface
)

// workloadGates turn on kube-scheduler's gang and topology placement and
// the Job controller's Workload and PodGroup (all off by default in 1.37).
var workloadGates = map[string]bool{
	"GenericWorkload":                 true,
	"WorkloadWithJob":                 true,
	"TopologyAwareWorkloadScheduling": true,
}

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, framework.Options{
		Name:           "native",
		Topology:       filepath.Join("testdata", "topology.yaml"),
		Namespace:      namespace,
		Controller:     true,
		ControllerArgs: []string{"-v=2"},
		Manifests:      []string{filepath.Join("deployments", "admission")},
		FeatureGates:   workloadGates,
		Peers:          []cluster.Peer{cluster.PeerJobSet},
	}, func(s *framework.Suite) error {
		suite, lc, client = s, s.Cluster, s.Client
		return nil
	}))
}
