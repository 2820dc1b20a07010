package parity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	gputopology "github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// The suite's namespaces: the framework's, a second one, and one labelled
// to allow claims with admin access.
const (
	namespace      = "gputopo-parity"
	namespace2     = "gputopo-parity-2"
	adminNamespace = "gputopo-parity-admin"
	// adminAccessLabel allows adminAccess requests in a namespace.
	adminAccessLabel = "resource.kubernetes.io/admin-access"
)

var (
	suite  *framework.Suite
	lc     *cluster.Cluster
	client kubernetes.Interface
	shape  *clusterShape
	inv    inventory
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, framework.Options{
		Name:       "parity",
		Topology:   filepath.Join("testdata", "topology.yaml"),
		Namespace:  namespace,
		Controller: true,
		// -v=4 logs the controller's plans and refusals, which a
		// disagreement's report needs.
		ControllerArgs: []string{"-v=4"},
		Manifests:      []string{filepath.Join("deployments", "admission")},
	}, func(s *framework.Suite) error {
		suite, lc, client = s, s.Cluster, s.Client
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := setupNamespaces(ctx); err != nil {
			return err
		}
		var err error
		if shape, err = loadClusterShape(ctx); err != nil {
			return err
		}
		if err := setupOtherDriver(ctx, shape); err != nil {
			return err
		}
		if shape.extended, err = setupExtendedResource(ctx); err != nil {
			return err
		}
		inv, err = loadInventory(ctx)
		return err
	}))
}

// setupNamespaces creates the suite's other namespaces with the demo claim
// templates in each.
func setupNamespaces(ctx context.Context) error {
	for _, ns := range []string{namespace2, adminNamespace} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if ns == adminNamespace {
			obj.Labels = map[string]string{adminAccessLabel: "true"}
		}
		if err := suite.AddNamespace(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

// loadClusterShape reads the nodes' leaves, profiles and sharing from the
// API server.
func loadClusterShape(ctx context.Context) (*clusterShape, error) {
	cs := &clusterShape{leafOf: map[string]string{}, profile: map[string]string{}, shared: map[string]bool{},
		namespaces: []string{namespace, namespace2, adminNamespace}, adminNamespace: adminNamespace, templates: suite.Templates,
		taintRules: framework.ServesDeviceTaintRules(client)}
	for _, spec := range suite.Nodes {
		n, err := client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get node %s: %w", spec.Name, err)
		}
		leaf := n.Labels[cluster.LabelLeaf]
		if leaf == "" {
			return nil, fmt.Errorf("node %s has no leaf label %s", n.Name, cluster.LabelLeaf)
		}
		cs.nodes = append(cs.nodes, n.Name)
		cs.leafOf[n.Name] = leaf
		if len(cs.leaves) == 0 || cs.leaves[len(cs.leaves)-1] != leaf {
			cs.leaves = append(cs.leaves, leaf)
		}
		cs.profile[n.Name] = spec.Profile
		if v := n.Labels[gputopology.LabelSharedGPUs]; v != "" && v != "none" {
			cs.shared[n.Name] = true
		}
	}
	return cs, nil
}

// setupOtherDriver publishes devices of another driver, which has no
// kubelet plugin: two in a pool every node can use (allNodes), two in a
// pool for the nodes of the last leaf (nodeSelector), and one on each node
// (nodeName), each with the attribute scope saying which; and a
// DeviceClass for them.
func setupOtherDriver(ctx context.Context, cs *clusterShape) error {
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: otherDriver},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", otherDriver)}}}},
	}
	if _, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create DeviceClass %s: %w", otherDriver, err)
	}
	devices := func(scope string, n int) []resourcev1.Device {
		var out []resourcev1.Device
		for i := range n {
			out = append(out, resourcev1.Device{Name: fmt.Sprintf("nic-%d", i), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				otherScope: {StringValue: ptr.To(scope)}}})
		}
		return out
	}
	leaf := cs.leaves[len(cs.leaves)-1]
	slices := []resourcev1.ResourceSliceSpec{
		{Pool: resourcev1.ResourcePool{Name: "nic-all"}, AllNodes: ptr.To(true), Devices: devices("all", 2)},
		{Pool: resourcev1.ResourcePool{Name: "nic-" + leaf}, Devices: devices("leaf", 2),
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: cluster.LabelLeaf, Operator: corev1.NodeSelectorOpIn, Values: []string{leaf}}}}}}},
	}
	for _, n := range cs.nodes {
		slices = append(slices, resourcev1.ResourceSliceSpec{Pool: resourcev1.ResourcePool{Name: "nic-" + n}, NodeName: ptr.To(n), Devices: devices("node", 1)})
	}
	for _, spec := range slices {
		spec.Driver = otherDriver
		spec.Pool.ResourceSliceCount = 1
		s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: otherDriver + "-" + spec.Pool.Name}, Spec: spec}
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ResourceSlice %s: %w", s.Name, err)
		}
	}
	cs.otherDriver = true
	cs.otherLeaf = leaf
	return nil
}

// setupExtendedResource creates a DeviceClass of gputopo's GPUs that pods
// ask for as the extended resource gputopo.dev/gpu. It reports false when
// the API server drops the field (DRAExtendedResource off).
func setupExtendedResource(ctx context.Context) (bool, error) {
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: extendedClass},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == %q", gputopology.DriverName)}}},
			ExtendedResourceName: ptr.To(extendedName),
		},
	}
	got, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("create DeviceClass %s: %w", extendedClass, err)
	}
	return got.Spec.ExtendedResourceName != nil, nil
}
