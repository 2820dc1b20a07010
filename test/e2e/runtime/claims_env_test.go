package runtime

import (
	"context"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestClaimContainerTopologyEnv: the README's container environment
// table: "GPUTOPO_NODE: node name", "GPUTOPO_LEAF, GPUTOPO_SPINE: the
// node's leaf and spine", "GPUTOPO_NVLINK_DOMAIN: NVLink domain(s) of the
// claim's GPUs", "GPUTOPO_DEVICE_GPU_<N>: UUID of device gpu-<N>",
// "GPUTOPO_NVLINK_DOMAIN_GPU_<N>, GPUTOPO_NVLINK_CLIQUE_GPU_<N>: NVLink
// domain and clique of device gpu-<N>" (the clique ones only when there is
// one). A container that containerd really runs with an NVLink pair
// prints its environment; each variable has the value the node's labels
// and its ResourceSlice give.
func TestClaimContainerTopologyEnv(t *testing.T) {
	p := runProbe(t, "topo-env", map[string]string{"pair": "gpu-2-nvlink-pair"})
	n, err := client.CoreV1().Nodes().Get(framework.Ctx(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := framework.PodClaim(framework.Ctx(t), client, p.pod, "pair")
	if err != nil {
		t.Fatal(err)
	}
	devices := sliceDevices(t)
	want := map[string]string{
		topology.EnvNode:  node,
		topology.EnvLeaf:  n.Labels[cluster.LabelLeaf],
		topology.EnvSpine: n.Labels[cluster.LabelSpine],
	}
	var domains []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		d, ok := devices[r.Device]
		if !ok {
			t.Fatalf("device %s of claim %s is not in %s's ResourceSlices", r.Device, claim.Name, node)
		}
		suffix := "_GPU_" + strings.TrimPrefix(r.Device, "gpu-")
		want["GPUTOPO_DEVICE"+suffix] = str(d, topology.AttrUUID)
		domain := str(d, topology.AttrNVLinkDomain)
		if domain == "" {
			t.Fatalf("device %s of a gpu-2-nvlink-pair claim has no %s", r.Device, topology.AttrNVLinkDomain)
		}
		want[topology.EnvNVLinkDomain+suffix] = domain
		if c := str(d, topology.AttrNVLinkClique); c != "" {
			want[topology.EnvNVLinkClique+suffix] = c
		} else if v, ok := p.seen.env[topology.EnvNVLinkClique+suffix]; ok {
			t.Errorf("device %s has no clique but the container has %s=%q", r.Device, topology.EnvNVLinkClique+suffix, v)
		}
		domains = append(domains, domain)
	}
	if want[topology.EnvLeaf] == "" || want[topology.EnvSpine] == "" {
		t.Fatalf("node %s has no leaf or spine label: %v", node, n.Labels)
	}
	for k, v := range want {
		if got, ok := p.seen.env[k]; !ok || got != v {
			t.Errorf("container: %s=%q (set %v), want %q", k, got, ok, v)
		}
	}
	// The claim-wide domain: the pair's one domain (both GPUs share it).
	if got := p.seen.env[topology.EnvNVLinkDomain]; !strings.Contains(got, domains[0]) {
		t.Errorf("container: %s=%q, want the pair's domain %q", topology.EnvNVLinkDomain, got, domains[0])
	}
	t.Logf("container env: %s=%s %s=%s %s=%s", topology.EnvNode, p.seen.env[topology.EnvNode], topology.EnvLeaf, p.seen.env[topology.EnvLeaf], topology.EnvSpine, p.seen.env[topology.EnvSpine])
}

// sliceDevices returns the gputopo devices the suite's node publishes, by name.
func sliceDevices(t *testing.T) map[string]resourcev1.Device {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]resourcev1.Device{}
	for _, s := range list.Items {
		if s.Spec.Driver == topology.DriverName && s.Spec.Pool.Name == node {
			for _, d := range s.Spec.Devices {
				out[d.Name] = d
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s devices published for %s", topology.DriverName, node)
	}
	return out
}

// str is a device's string attribute of the driver's domain, "" if absent.
func str(d resourcev1.Device, name string) string {
	if a, ok := d.Attributes[resourcev1.QualifiedName(topology.DriverName+"/"+name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	if a, ok := d.Attributes[resourcev1.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
