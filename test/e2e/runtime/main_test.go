package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"

	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// namespace holds every namespaced object the suite creates.
const namespace = "gputopo-runtime"

var (
	lc     *cluster.Cluster
	client kubernetes.Interface
	// node is the suite's one node, on containerd.
	node string
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, framework.Options{
		Name:      "runtime",
		Topology:  filepath.Join("testdata", "topology.yaml"),
		Namespace: namespace,
	}, func(s *framework.Suite) error {
		lc, client, node = s.Cluster, s.Client, s.Nodes[0].Name
		return nil
	}))
}
