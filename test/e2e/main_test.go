package e2e

import (
	"os"
	"path/filepath"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"

	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// namespace holds every namespaced object the suite creates.
const namespace = "gputopo-e2e"

// The suite's cluster, started once by TestMain.
var (
	suite     *framework.Suite
	lc        *cluster.Cluster
	client    kubernetes.Interface
	k8sBinDir string // kubectl and the control plane
	pluginBin string
	// templates are the ResourceClaimTemplates of demo/specs/claims, by name.
	templates map[string]*resourcev1.ResourceClaimTemplate
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, framework.Options{
		Name:      "e2e",
		Topology:  filepath.Join("testdata", "topology.yaml"),
		Namespace: namespace,
	}, func(s *framework.Suite) error {
		suite, lc, client = s, s.Cluster, s.Client
		k8sBinDir, pluginBin, templates = s.K8sBinDir, s.PluginBin, s.Templates
		return nil
	}))
}
