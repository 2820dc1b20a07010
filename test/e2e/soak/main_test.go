package soak

import (
	"os"
	"path/filepath"
	"testing"

	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// Environment of TestSoak.
const (
	envDuration = "GPUTOPO_SOAK_DURATION" // how long the workload and faults run; no cluster starts without it
	envSeed     = "GPUTOPO_SOAK_SEED"     // the generator's seed (default 1)
)

// namespace is the framework's namespace; the workload uses it and
// otherNamespaces.
const namespace = "gputopo-soak"

var otherNamespaces = []string{"gputopo-soak-b", "gputopo-soak-c"}

// The controller's timeouts, passed on its command line so that the
// invariants' limits follow them.
const (
	bindTimeout        = "60s"
	reservationTimeout = "5m"
)

var (
	suite *framework.Suite
	lc    *cluster.Cluster
)

func TestMain(m *testing.M) {
	if os.Getenv(envDuration) == "" {
		// The checkers' own tests only; TestSoak skips.
		os.Exit(m.Run())
	}
	os.Exit(framework.Main(m, framework.Options{
		Name:      "soak",
		Topology:  filepath.Join("testdata", "topology.yaml"),
		Namespace: namespace,
		// -v=4 logs the controller's plans, refusals and releases, which
		// a breach's report points into.
		Controller:     true,
		ControllerArgs: []string{"-v=4", "--bind-timeout=" + bindTimeout, "--reservation-timeout=" + reservationTimeout},
		Manifests:      []string{filepath.Join("deployments", "admission")},
	}, func(s *framework.Suite) error {
		suite, lc = s, s.Cluster
		return nil
	}))
}
