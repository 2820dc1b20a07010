package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// TestVolumeNodes checks where a pod's PersistentVolumeClaims let it go,
// node by node, as kube-scheduler's VolumeBinding and VolumeZone filters
// judge them, and that a pod no node can take for its volumes waits,
// saying why.
func TestVolumeNodes(t *testing.T) {
	const zone, region, betaZone = v1.LabelTopologyZone, v1.LabelTopologyRegion, v1.LabelFailureDomainBetaZone
	nodes := []*v1.Node{
		testNode("n0", zone, "z1", region, "r1"),
		testNode("n1", zone, "z2", region, "r1"),
		testNode("n2", zone, "z3"),
		testNode("n3"), // no zone or region label
		testNode("n4", region, "r1"),
	}
	all := []string{"n0", "n1", "n2", "n3", "n4"}
	wffc, immediate := storagev1.VolumeBindingWaitForFirstConsumer, storagev1.VolumeBindingImmediate
	classes := []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &wffc},
		{ObjectMeta: metav1.ObjectMeta{Name: "csi"}, Provisioner: "csi.example.com", VolumeBindingMode: &wffc},
		{ObjectMeta: metav1.ObjectMeta{Name: "csi-z1"}, Provisioner: "csi.example.com", VolumeBindingMode: &wffc,
			AllowedTopologies: []v1.TopologySelectorTerm{{MatchLabelExpressions: []v1.TopologySelectorLabelRequirement{{Key: zone, Values: []string{"z1"}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "now"}, Provisioner: "csi.example.com", VolumeBindingMode: &immediate},
		{ObjectMeta: metav1.ObjectMeta{Name: "cap"}, Provisioner: "cap.example.com", VolumeBindingMode: &wffc},
		{ObjectMeta: metav1.ObjectMeta{Name: "empty-topology"}, Provisioner: "csi.example.com", VolumeBindingMode: &wffc, AllowedTopologies: []v1.TopologySelectorTerm{{}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "bad-topology"}, Provisioner: "csi.example.com", VolumeBindingMode: &wffc, AllowedTopologies: []v1.TopologySelectorTerm{
			{MatchLabelExpressions: []v1.TopologySelectorLabelRequirement{{Key: zone, Values: []string{"Zone B"}}}},
			{MatchLabelExpressions: []v1.TopologySelectorLabelRequirement{{Key: zone, Values: []string{"z2"}}}}}},
	}
	drivers := []*storagev1.CSIDriver{
		{ObjectMeta: metav1.ObjectMeta{Name: "cap.example.com"}, Spec: storagev1.CSIDriverSpec{StorageCapacity: ptr.To(true)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "csi.example.com"}, Spec: storagev1.CSIDriverSpec{StorageCapacity: ptr.To(false)}},
	}
	capacities := []*storagev1.CSIStorageCapacity{
		{ObjectMeta: metav1.ObjectMeta{Name: "z1", Namespace: "kube-system"}, StorageClassName: "cap", MaximumVolumeSize: ptr.To(resource.MustParse("10Gi")), Capacity: ptr.To(resource.MustParse("100Gi")),
			NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{zone: "z1"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "z2", Namespace: "kube-system"}, StorageClassName: "cap", Capacity: ptr.To(resource.MustParse("1Gi")),
			NodeTopology: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: zone, Operator: metav1.LabelSelectorOpIn, Values: []string{"z2"}}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "kube-system"}, StorageClassName: "csi", Capacity: ptr.To(resource.MustParse("100Gi")),
			NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{zone: "z3"}}},
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "p-uid"}}
	bound := func(name, pv string) *v1.PersistentVolumeClaim {
		c := testPVC(name, "local", "1Gi")
		c.Spec.VolumeName = pv
		c.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
		c.Status.Phase = v1.ClaimBound
		return c
	}
	onNodes := func(pv *v1.PersistentVolume, op v1.NodeSelectorOperator, names ...string) *v1.PersistentVolume {
		pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: op, Values: names}}}}}}
		return pv
	}
	labelled := func(pv *v1.PersistentVolume, kv ...string) *v1.PersistentVolume {
		pv.Labels = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			pv.Labels[kv[i]] = kv[i+1]
		}
		return pv
	}
	byName := func(pv *v1.PersistentVolume, op v1.NodeSelectorOperator, names ...string) *v1.PersistentVolume {
		pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchFields: []v1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: op, Values: names}}}}}}
		return pv
	}
	selected := func(c *v1.PersistentVolumeClaim, node string) *v1.PersistentVolumeClaim {
		c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": node}
		return c
	}
	rwop := func(c *v1.PersistentVolumeClaim) *v1.PersistentVolumeClaim {
		c.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}
		return c
	}
	user := func(name, node string, phase v1.PodPhase) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
			Spec: v1.PodSpec{NodeName: node, Volumes: []v1.Volume{pvcVolume("data")}}, Status: v1.PodStatus{Phase: phase}}
	}
	claimedBy := func(pv *v1.PersistentVolume, claim string) *v1.PersistentVolume {
		pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: "default", Name: claim}
		return pv
	}
	for name, tc := range map[string]struct {
		volumes []v1.Volume // default: one volume naming claim "data"
		pvcs    []*v1.PersistentVolumeClaim
		pvs     []*v1.PersistentVolume
		want    []string // the nodes the pod may use
		wait    string   // in the reason no node can take it
		// maxTerms bounds the terms of the selectors, when set.
		maxTerms int
		users    []*v1.Pod // other pods, by the claims they use
	}{
		// VolumeRestrictions: a ReadWriteOncePod claim a pod on a node
		// uses keeps every other pod pending.
		"a ReadWriteOncePod claim another pod on a node uses": {
			pvcs: []*v1.PersistentVolumeClaim{rwop(bound("data", "pv"))}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")},
			users: []*v1.Pod{user("other", "n1", v1.PodRunning)}, wait: "can be used by one pod only (ReadWriteOncePod), and pod other on node n1 uses it",
		},
		"a ReadWriteOncePod claim a finished pod used": {
			pvcs: []*v1.PersistentVolumeClaim{rwop(bound("data", "pv"))}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")},
			users: []*v1.Pod{user("other", "n1", v1.PodSucceeded)}, want: all,
		},
		"a ReadWriteOncePod claim a pod not on a node yet names": {
			pvcs: []*v1.PersistentVolumeClaim{rwop(bound("data", "pv"))}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")},
			users: []*v1.Pod{user("other", "", v1.PodPending)}, want: all,
		},
		"a ReadWriteOncePod claim the pod itself uses": {
			pvcs: []*v1.PersistentVolumeClaim{rwop(bound("data", "pv"))}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")},
			users: []*v1.Pod{func() *v1.Pod { u := user("p", "n1", v1.PodRunning); u.UID = pod.UID; return u }()}, want: all,
		},
		"a ReadWriteOnce claim another pod uses": {
			pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")},
			users: []*v1.Pod{user("other", "n1", v1.PodRunning)}, want: all,
		},
		"no volume":       {volumes: []v1.Volume{}, want: all},
		"an emptyDir":     {volumes: []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}, want: all},
		"a missing claim": {wait: "PersistentVolumeClaim data of volume data does not exist"},
		"a claim lost":    {pvcs: []*v1.PersistentVolumeClaim{func() *v1.PersistentVolumeClaim { c := bound("data", "gone"); c.Status.Phase = v1.ClaimLost; return c }()}, wait: "no longer exists"},
		"a claim deleted": {pvcs: []*v1.PersistentVolumeClaim{func() *v1.PersistentVolumeClaim {
			c := bound("data", "pv")
			c.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			return c
		}()}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")}, wait: "being deleted"},
		"bound, anywhere":   {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")}, want: all},
		"bound, node-local": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{onNodes(testPV("pv", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n1")}, want: []string{"n1"}},
		"bound, off a node": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{onNodes(testPV("pv", "local", "1Gi"), v1.NodeSelectorOpNotIn, "host-n1")}, want: []string{"n0", "n2", "n3", "n4"}},
		"two bound volumes: both hold the pod": {
			volumes: []v1.Volume{pvcVolume("a"), pvcVolume("b")},
			pvcs:    []*v1.PersistentVolumeClaim{bound("a", "pv-a"), bound("b", "pv-b")},
			pvs:     []*v1.PersistentVolume{onNodes(testPV("pv-a", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n0", "host-n1"), onNodes(testPV("pv-b", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n1", "host-n2")},
			want:    []string{"n1"},
		},
		"bound to a volume that does not exist": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "gone")}, wait: "PersistentVolume gone, bound to PersistentVolumeClaim data, does not exist"},
		// VolumeZone: a node with no zone or region label takes any
		// volume; any other needs each label's value among the volume's.
		"a volume in two zones": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{labelled(testPV("pv", "local", "1Gi"), zone, "z1__z2")}, want: []string{"n0", "n1", "n3"}},
		"a volume in a zone and a region": {
			pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{labelled(testPV("pv", "local", "1Gi"), zone, "z2", region, "r1")},
			want: []string{"n1", "n3"},
		},
		"a beta zone label matches a node's GA label": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{labelled(testPV("pv", "local", "1Gi"), betaZone, "z3")}, want: []string{"n2", "n3"}},
		"a zone label that does not parse is ignored": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{labelled(testPV("pv", "local", "1Gi"), zone, "z1__")}, want: all},
		"not bound, immediate binding":                {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "now", "1Gi")}, wait: "not bound yet, and its binding is immediate"},
		"not bound, no class":                         {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "", "1Gi")}, wait: "not bound yet and names no StorageClass"},
		"not bound, its class missing":                {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "nowhere", "1Gi")}, wait: "its StorageClass nowhere does not exist"},
		"bound by name but not complete": {
			pvcs: []*v1.PersistentVolumeClaim{func() *v1.PersistentVolumeClaim {
				c := testPVC("data", "local", "1Gi")
				c.Spec.VolumeName = "pv"
				return c
			}()},
			pvs: []*v1.PersistentVolume{testPV("pv", "local", "1Gi")}, wait: "names PersistentVolume pv, which is not bound to it yet",
		},
		// CheckNodeAffinity matches a volume's node affinity against the
		// node's labels only: a node name field matches the empty name.
		// CheckNodeAffinity matches a volume's node affinity against a
		// node with labels and no name: field requirements are passed
		// over, and an empty term matches no node.
		"a node name in a volume's node affinity is passed over": {
			pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{byName(testPV("pv", "local", "1Gi"), v1.NodeSelectorOpIn, "n1")}, want: all,
		},
		"a node name beside a label in one term: the label holds": {
			pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{func() *v1.PersistentVolume {
				pv := byName(testPV("pv", "local", "1Gi"), v1.NodeSelectorOpIn, "n1")
				t := &pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0]
				t.MatchExpressions = []v1.NodeSelectorRequirement{{Key: zone, Operator: v1.NodeSelectorOpIn, Values: []string{"z1"}}}
				return pv
			}()}, want: []string{"n0"},
		},
		"an empty term in a volume's node affinity matches no node": {
			pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{func() *v1.PersistentVolume {
				pv := testPV("pv", "local", "1Gi")
				pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{}}}}
				return pv
			}()},
		},
		"an empty term beside another": {
			pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{func() *v1.PersistentVolume {
				pv := testPV("pv", "local", "1Gi")
				pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{},
					{MatchExpressions: []v1.NodeSelectorRequirement{{Key: zone, Operator: v1.NodeSelectorOpIn, Values: []string{"z2"}}}}}}}
				return pv
			}()}, want: []string{"n1"},
		},
		"a zone that is no label value is passed over": {pvcs: []*v1.PersistentVolumeClaim{bound("data", "pv")}, pvs: []*v1.PersistentVolume{labelled(testPV("pv", "local", "1Gi"), zone, "z1___b")}, want: []string{"n0", "n3"}},
		"the zones of three volumes intersected": {
			volumes: []v1.Volume{pvcVolume("a"), pvcVolume("b"), pvcVolume("c")},
			pvcs:    []*v1.PersistentVolumeClaim{bound("a", "pv-a"), bound("b", "pv-b"), bound("c", "pv-c")},
			pvs: []*v1.PersistentVolume{labelled(testPV("pv-a", "local", "1Gi"), betaZone, "z1__z2", v1.LabelFailureDomainBetaRegion, "r1"),
				labelled(testPV("pv-b", "local", "1Gi"), betaZone, "z2__z3"), labelled(testPV("pv-c", "local", "1Gi"), betaZone, "z3__z2")},
			want: []string{"n1", "n3"}, maxTerms: 5,
		},
		"volumes in no common zone: only nodes without zone labels": {
			volumes: []v1.Volume{pvcVolume("a"), pvcVolume("b")},
			pvcs:    []*v1.PersistentVolumeClaim{bound("a", "pv-a"), bound("b", "pv-b")},
			pvs:     []*v1.PersistentVolume{labelled(testPV("pv-a", "local", "1Gi"), zone, "z1"), labelled(testPV("pv-b", "local", "1Gi"), zone, "z2")},
			want:    []string{"n3"},
		},
		// VolumeZone reads only volumes that name a claim, not ephemeral
		// ones.
		"a generic ephemeral volume's zone": {
			volumes: []v1.Volume{ephemeralVolume("scratch")},
			pvcs:    []*v1.PersistentVolumeClaim{podOwned(bound("p-scratch", "pv"), pod)},
			pvs:     []*v1.PersistentVolume{labelled(testPV("pv", "local", "1Gi"), zone, "z1")},
			want:    all,
		},
		// WaitForFirstConsumer: where a volume could be bound or made.
		"the scheduler chose its node":                                                 {pvcs: []*v1.PersistentVolumeClaim{selected(testPVC("data", "csi", "1Gi"), "n2")}, want: []string{"n2"}},
		"the scheduler chose a node outside the allowed topology":                      {pvcs: []*v1.PersistentVolumeClaim{selected(testPVC("data", "csi-z1", "1Gi"), "n2")}},
		"the scheduler chose a node, and the class's empty topology term matches none": {pvcs: []*v1.PersistentVolumeClaim{selected(testPVC("data", "empty-topology", "1Gi"), "n2")}},
		"the class's empty topology term matches no node":                              {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "empty-topology", "1Gi")}},
		"an allowed topology that does not parse fails only itself":                    {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "bad-topology", "1Gi")}, want: []string{"n1"}},
		"the scheduler chose a node with room":                                         {pvcs: []*v1.PersistentVolumeClaim{selected(testPVC("data", "cap", "2Gi"), "n0")}, want: []string{"n0"}},
		"the scheduler chose a node without room":                                      {pvcs: []*v1.PersistentVolumeClaim{selected(testPVC("data", "cap", "2Gi"), "n1")}},
		"the scheduler chose a node, and the class does not provision": {
			pvcs: []*v1.PersistentVolumeClaim{selected(testPVC("data", "local", "1Gi"), "n2")},
			wait: "waits for a volume made on node n2, and its StorageClass local does not provision volumes",
		},
		"local volumes on three nodes, one term": {
			pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "local", "1Gi")},
			pvs: []*v1.PersistentVolume{onNodes(testPV("pv-0", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n0"), onNodes(testPV("pv-3", "local", "2Gi"), v1.NodeSelectorOpIn, "host-n3"),
				onNodes(testPV("pv-3b", "local", "2Gi"), v1.NodeSelectorOpIn, "host-n3"), onNodes(testPV("pv-4", "local", "2Gi"), v1.NodeSelectorOpIn, "host-n4")},
			want: []string{"n0", "n3", "n4"}, maxTerms: 1,
		},
		// kube-scheduler tries only a volume made for the claim, then
		// provisioning.
		"a volume made for the claim, beside a free one": {
			pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "local", "1Gi")},
			pvs: []*v1.PersistentVolume{claimedBy(onNodes(testPV("mine", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n1"), "data"),
				onNodes(testPV("free", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n3")},
			want: []string{"n1"},
		},
		"local volumes too small, of another class or taken": {
			pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "local", "2Gi")},
			pvs: []*v1.PersistentVolume{
				onNodes(testPV("small", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n0"),
				onNodes(testPV("other", "csi", "4Gi"), v1.NodeSelectorOpIn, "host-n1"),
				claimedBy(onNodes(testPV("taken", "local", "4Gi"), v1.NodeSelectorOpIn, "host-n2"), "someone-else"),
				onNodes(testPV("fits", "local", "4Gi"), v1.NodeSelectorOpIn, "host-n4"),
			},
			want: []string{"n4"},
		},
		"no local volume fits and none is provisioned": {
			pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "local", "8Gi")},
			pvs:  []*v1.PersistentVolume{onNodes(testPV("small", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n0")},
			wait: "no available PersistentVolume can bind PersistentVolumeClaim data, and its StorageClass local does not provision volumes",
		},
		"a volume made for the claim ahead of it": {
			pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "local", "1Gi")},
			pvs:  []*v1.PersistentVolume{claimedBy(onNodes(testPV("mine", "local", "1Gi"), v1.NodeSelectorOpIn, "host-n1"), "data")},
			want: []string{"n1"},
		},
		"provisioned anywhere": {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "csi", "1Gi")}, want: all},
		// Storage capacity: the driver of class cap publishes it (z1 has
		// room for 10Gi, z2 for 1Gi), csi's does not.
		"provisioned where the driver has room":        {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "cap", "2Gi")}, want: []string{"n0"}},
		"provisioned where the driver has room, small": {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "cap", "1Gi")}, want: []string{"n0", "n1"}},
		"the driver has room nowhere":                  {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "cap", "20Gi")}},
		"no size asked: no capacity checked": {pvcs: []*v1.PersistentVolumeClaim{func() *v1.PersistentVolumeClaim {
			c := testPVC("data", "cap", "1Gi")
			c.Spec.Resources.Requests = nil
			return c
		}()}, want: all},
		"provisioned in the allowed topology": {pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "csi-z1", "1Gi")}, want: []string{"n0"}},
		"provisioned in the allowed topology, or bound to a free volume elsewhere": {
			pvcs: []*v1.PersistentVolumeClaim{testPVC("data", "csi-z1", "1Gi")},
			pvs:  []*v1.PersistentVolume{onNodes(testPV("pv", "csi-z1", "1Gi"), v1.NodeSelectorOpIn, "host-n4")},
			want: []string{"n0", "n4"},
		},
		"a generic ephemeral volume not created yet": {volumes: []v1.Volume{ephemeralVolume("scratch")}, wait: "waiting for the ephemeral volume controller to create PersistentVolumeClaim p-scratch"},
		"a generic ephemeral volume": {
			volumes: []v1.Volume{ephemeralVolume("scratch")},
			pvcs:    []*v1.PersistentVolumeClaim{podOwned(testPVC("p-scratch", "csi-z1", "1Gi"), pod)},
			want:    []string{"n0"},
		},
		"a generic ephemeral volume's claim that another pod owns": {
			volumes: []v1.Volume{ephemeralVolume("scratch")},
			pvcs:    []*v1.PersistentVolumeClaim{testPVC("p-scratch", "csi", "1Gi")},
			wait:    "was not created for pod default/p",
		},
	} {
		t.Run(name, func(t *testing.T) {
			pvcIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			pvIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{pvClassIndex: indexPVByClass})
			classIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			driverIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			capIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			for _, o := range drivers {
				_ = driverIdx.Add(o)
			}
			for _, o := range capacities {
				_ = capIdx.Add(o)
			}
			for _, o := range tc.pvcs {
				_ = pvcIdx.Add(o)
			}
			for _, o := range tc.pvs {
				_ = pvIdx.Add(o)
			}
			for _, o := range classes {
				_ = classIdx.Add(o)
			}
			users := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{pvcUserIndex: indexByPVCUser})
			for _, u := range tc.users {
				_ = users.Add(u)
			}
			v := volumeView{users: users, pvcs: corelisters.NewPersistentVolumeClaimLister(pvcIdx), pvs: corelisters.NewPersistentVolumeLister(pvIdx), pvIdx: pvIdx, classes: storagelisters.NewStorageClassLister(classIdx),
				drivers: storagelisters.NewCSIDriverLister(driverIdx), capacities: storagelisters.NewCSIStorageCapacityLister(capIdx)}
			p := pod.DeepCopy()
			p.Spec.Volumes = tc.volumes
			if p.Spec.Volumes == nil {
				p.Spec.Volumes = []v1.Volume{pvcVolume("data")}
			}
			sels, wait := v.nodes(p)
			if tc.wait != "" {
				if !strings.Contains(wait, tc.wait) {
					t.Fatalf("waits for %q, want it to say %q", wait, tc.wait)
				}
				return
			}
			if wait != "" {
				t.Fatalf("waits for %q, want nodes %v", wait, tc.want)
			}
			var got []string
			terms := 0
			for _, s := range sels {
				terms += len(s.NodeSelectorTerms)
			}
			// As the planner matches them (Pod.Volumes): each on its own,
			// a term that does not parse matching no node.
			for _, n := range nodes {
				if !slices.ContainsFunc(sels, func(s *v1.NodeSelector) bool { ok, _ := nodeaffinity.NewLazyErrorNodeSelector(s).Match(n); return !ok }) {
					got = append(got, n.Name)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("the pod may use %v, want %v (selectors %v)", got, tc.want, sels)
			}
			if tc.maxTerms > 0 && terms > tc.maxTerms {
				t.Errorf("%d terms, want at most %d: %v", terms, tc.maxTerms, sels)
			}
		})
	}
}

func testNode(name string, labels ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: "host-" + name}}}
	for i := 0; i < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

func testPVC(name, class, size string) *v1.PersistentVolumeClaim {
	c := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}}},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimPending}}
	if class != "" {
		c.Spec.StorageClassName = ptr.To(class)
	}
	return c
}

func testPV(name, class, size string) *v1.PersistentVolume {
	return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{StorageClassName: class, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeAvailable}}
}

func pvcVolume(claim string) v1.Volume {
	return v1.Volume{Name: claim, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

func ephemeralVolume(name string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}
}

func podOwned(c *v1.PersistentVolumeClaim, p *v1.Pod) *v1.PersistentVolumeClaim {
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
	return c
}

// TestVolumesHoldTheGroup checks that the group is planned only onto
// nodes its pods' volumes allow, and that a group whose volume claim does
// not exist yet waits, saying so, until the claim's event requeues it.
func TestVolumesHoldTheGroup(t *testing.T) {
	withData := func(p *v1.Pod) *v1.Pod {
		p.Spec.Volumes = append(p.Spec.Volumes, pvcVolume("data"))
		return p
	}
	consolidated := map[string]string{"gputopo.dev/strategy": "consolidated"}
	boundTo := func(pv *v1.PersistentVolume) []any {
		c := testPVC("data", "", "1Gi")
		c.Spec.VolumeName = pv.Name
		c.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
		c.Status.Phase = v1.ClaimBound
		return []any{pv, c}
	}
	offN0 := testPV("pv", "", "1Gi")
	offN0.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpNotIn, Values: []string{"host-n0"}}}}}}}
	for name, tc := range map[string]struct {
		objs []any
		want string // the node both pods go to
	}{
		// consolidated fills n0 first
		"a volume anywhere":                       {objs: boundTo(testPV("pv", "", "1Gi")), want: "n0"},
		"a volume its node affinity keeps off n0": {objs: boundTo(offN0), want: "n1"},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, append([]any{job("train", 2)}, tc.objs...)...)
			h.addPod(withData(jobPod("train", 0, "gpu-4-nvlink", consolidated)))
			h.addPod(withData(jobPod("train", 1, "gpu-4-nvlink", consolidated)))
			h.settle()
			h.place("default/job/train")
			if a, b := h.allocatedNode("train-0"), h.allocatedNode("train-1"); a != tc.want || b != tc.want {
				t.Errorf("pods planned onto %q and %q, want both on %s", a, b, tc.want)
			}
		})
	}

	t.Run("a claim that does not exist yet", func(t *testing.T) {
		h := newHarness(t, job("train", 1))
		h.addPod(withData(jobPod("train", 0, "gpu-4-nvlink", nil)))
		h.settle()
		h.sync("default/job/train")
		if n := h.allocatedNode("train-0"); n != "" {
			t.Fatalf("planned onto %s while its volume claim does not exist", n)
		}
		st, err := placement.ParseStatus(h.pod("train-0").Annotations[placement.AnnotationStatus])
		if err != nil || st.Reason != placement.StatusWaitingForVolumes || !strings.Contains(st.Message, "PersistentVolumeClaim data of volume data does not exist") {
			t.Fatalf("status %+v (%v), want %s naming the claim", st, err, placement.StatusWaitingForVolumes)
		}
		objs := boundTo(offN0)
		h.create(objs[0]) // the volume, then the claim alone
		h.eventually("the volume in the informer", func() bool { _, err := h.c.volumes.pvs.Get("pv"); return err == nil })
		drain := func() {
			for h.c.queue.Len() > 0 {
				k, _ := h.c.queue.Get()
				h.c.queue.Done(k)
				h.c.queue.Forget(k)
			}
		}
		drain()
		h.create(objs[1])
		h.eventually("the claim's event to requeue the group", func() bool {
			if h.c.queue.Len() == 0 {
				return false
			}
			k, _ := h.c.queue.Get()
			h.c.queue.Done(k)
			return k == "default/job/train"
		})
		h.place("default/job/train")
		if n := h.allocatedNode("train-0"); n == "" || n == "n0" {
			t.Errorf("planned onto %q once the claim is bound; want a node but n0, which its volume leaves out", n)
		}
	})
}

// A pod is indexed by the claims its volumes name until it is bound: a
// claim's event requeues only the groups it may still change.
func TestIndexByPVC(t *testing.T) {
	p := jobPod("j", 0, "gpu-1", nil)
	p.Spec.Volumes = []v1.Volume{pvcVolume("data"), ephemeralVolume("scratch"), {Name: "tmp", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	if got, _ := indexByPVC(p); !slices.Equal(got, []string{"default/data", "default/j-0-scratch"}) {
		t.Errorf("an unbound pod is indexed under %v, want default/data and default/j-0-scratch", got)
	}
	plain := p.DeepCopy()
	plain.Annotations, plain.OwnerReferences = nil, nil
	if got, _ := indexByPVC(plain); got != nil {
		t.Errorf("a pod of no group is indexed under %v, want nothing", got)
	}
	p.Spec.NodeName = "n0"
	if got, _ := indexByPVC(p); got != nil {
		t.Errorf("a bound pod is indexed under %v, want nothing", got)
	}
}

// A resync (the same version again) requeues nothing; a change does.
func TestVolumeHandlerPassesOverResyncs(t *testing.T) {
	p := jobPod("a", 0, "gpu-1", nil)
	p.Spec.Volumes = []v1.Volume{pvcVolume("data")}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{pvcIndex: indexByPVC})
	_ = idx.Add(p)
	c := &Controller{podIdx: idx, queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	defer c.queue.ShutDown()
	old, cur := testPVC("data", "local", "1Gi"), testPVC("data", "local", "1Gi")
	old.ResourceVersion, cur.ResourceVersion = "1", "1"
	h := c.volumeHandler()
	h.OnUpdate(old, cur)
	if n := c.queue.Len(); n != 0 {
		t.Fatalf("a resync requeued %d groups", n)
	}
	cur.ResourceVersion = "2"
	h.OnUpdate(old, cur)
	if n := c.queue.Len(); n != 1 {
		t.Fatalf("a change requeued %d groups, want 1", n)
	}
}

// onVolume requeues the groups of the unbound pods a claim, volume, class
// or storage capacity may change, and nothing else.
func TestOnVolumeRequeuesTheGroupsItMayChange(t *testing.T) {
	withClaim := func(p *v1.Pod, claim string) *v1.Pod {
		p.Spec.Volumes = []v1.Volume{pvcVolume(claim)}
		return p
	}
	pods := []*v1.Pod{withClaim(jobPod("a", 0, "gpu-1", nil), "data-a"), withClaim(jobPod("b", 0, "gpu-1", nil), "data-b"), jobPod("c", 0, "gpu-1", nil)}
	bound := withClaim(jobPod("d", 0, "gpu-1", nil), "data-a")
	bound.Spec.NodeName = "n0"
	boundPV := testPV("pv", "local", "1Gi")
	boundPV.Spec.ClaimRef = &v1.ObjectReference{Namespace: "default", Name: "data-b"}
	boundPV.Status.Phase = v1.VolumeBound
	for name, tc := range map[string]struct {
		obj  any
		want []string
	}{
		"a claim":                     {obj: testPVC("data-a", "local", "1Gi"), want: []string{"default/job/a"}},
		"a claim no pod waiting uses": {obj: testPVC("data-z", "local", "1Gi")},
		"a claim deleted, its last state unknown": {obj: cache.DeletedFinalStateUnknown{Key: "default/data-b", Obj: testPVC("data-b", "local", "1Gi")}, want: []string{"default/job/b"}},
		"a volume bound to a claim":               {obj: boundPV, want: []string{"default/job/b"}},
		"an available volume":                     {obj: testPV("free", "local", "1Gi"), want: []string{"default/job/a", "default/job/b"}},
		"a class":                                 {obj: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}}, want: []string{"default/job/a", "default/job/b"}},
	} {
		t.Run(name, func(t *testing.T) {
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{pvcIndex: indexByPVC})
			for _, p := range append(slices.Clone(pods), bound) {
				_ = idx.Add(p)
			}
			c := &Controller{podIdx: idx, queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
			defer c.queue.ShutDown()
			c.onVolume(tc.obj)
			var got []string
			for c.queue.Len() > 0 {
				k, _ := c.queue.Get()
				got = append(got, k)
				c.queue.Done(k)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("requeued %v, want %v", got, tc.want)
			}
		})
	}
}

// A pod planned again after its node refused it is kept off that node,
// unless its volumes allow no other: a claim kube-scheduler bound there
// before the pod's own binding failed holds it to that node alone.
func TestRefusedNodeKeptWhenOnlyItsVolumesAllowIt(t *testing.T) {
	for name, tc := range map[string]struct {
		hosts []string // where the volume may be used
		want  string
	}{
		"the volume allows the refused node alone": {hosts: []string{"host-n1"}, want: "n1"},
		"the volume allows another node too":       {hosts: []string{"host-n1", "host-n2"}, want: "n2"},
	} {
		t.Run(name, func(t *testing.T) {
			pv := testPV("pv", "", "1Gi")
			pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: tc.hosts}}}}}}
			pvc := testPVC("data", "", "1Gi")
			pvc.Spec.VolumeName = "pv"
			pvc.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
			pvc.Status.Phase = v1.ClaimBound
			h := newHarness(t, job("train", 1), pv, pvc)
			p := jobPod("train", 0, "gpu-4-nvlink", map[string]string{placement.AnnotationNode: "n1"})
			p.Spec.SchedulingGates = nil // released: its gate opened, and n1 refused it
			p.Spec.Volumes = []v1.Volume{pvcVolume("data")}
			h.addPod(p)
			h.settle()
			h.eventually("the volume in the informer", func() bool {
				_, err := h.c.volumes.pvcs.PersistentVolumeClaims("default").Get("data")
				return err == nil
			})
			h.place("default/job/train")
			if got := h.allocatedNode("train-0"); got != tc.want {
				t.Errorf("planned onto %q, want %s", got, tc.want)
			}
		})
	}
}

// A pod that stops using a claim (it is gone, or finished) requeues the
// groups whose unbound pods name it: a ReadWriteOncePod claim it held is
// free for them.
func TestClaimUserGoneRequeuesTheGroupsThatWaitForIt(t *testing.T) {
	waiting := jobPod("a", 0, "gpu-1", nil)
	waiting.Spec.Volumes = []v1.Volume{pvcVolume("data")}
	other := jobPod("b", 0, "gpu-1", nil)
	other.Spec.Volumes = []v1.Volume{pvcVolume("scratch")}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{pvcIndex: indexByPVC})
	_ = idx.Add(waiting)
	_ = idx.Add(other)
	c := &Controller{podIdx: idx, queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	defer c.queue.ShutDown()
	holder := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "default"},
		Spec: v1.PodSpec{NodeName: "n1", Volumes: []v1.Volume{pvcVolume("data")}}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	c.onClaimUser(holder)
	if n := c.queue.Len(); n != 1 {
		t.Fatalf("requeued %d groups, want 1", n)
	}
	if k, _ := c.queue.Get(); k != "default/job/a" {
		t.Errorf("requeued %s, want default/job/a, whose pod names the claim", k)
	}
}
