package peers

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// namespace holds every object the suite creates.
const namespace = "gputopo-peers"

var (
	suite  *framework.Suite
	client kubernetes.Interface
	dyn    dynamic.Interface
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, framework.Options{
		Name:       "peers",
		Topology:   filepath.Join("testdata", "topology.yaml"),
		Namespace:  namespace,
		Controller: true,
		Manifests:  []string{filepath.Join("deployments", "admission")},
		Peers:      []cluster.Peer{cluster.PeerJobSet, cluster.PeerLWS, cluster.PeerKueue},
	}, func(s *framework.Suite) error {
		suite, client = s, s.Client
		var err error
		dyn, err = dynamic.NewForConfig(s.Cluster.RESTConfig())
		return err
	}))
}
