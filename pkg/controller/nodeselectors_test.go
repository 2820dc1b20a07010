package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gputopo/gputopo/pkg/nodepin"
	"github.com/gputopo/gputopo/pkg/topology"
)

func celSpec(exprs ...string) resourceapi.ResourceClaimSpec {
	r := resourceapi.DeviceRequest{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gputopo.dev", Count: 4}}
	for _, e := range exprs {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}}
}

// The ConfigMap of each namespace follows its templates and user claims:
// written for those that pin a leaf or spine, not for a claim made from
// a template, deleted when nothing pins, and emptied of a tier whose
// nodes take it from different labels.
func TestPinSyncKeepsEachNamespacesConfigMap(t *testing.T) {
	leaf0 := `device.attributes["gpu.gputopo.dev"].?leaf.orValue("") == "leaf-0"`
	spine1 := `device.attributes["gpu.gputopo.dev"].spine == "spine-1"`
	node := func(name string, labels map[string]string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	client := fake.NewClientset(
		node("n0", map[string]string{topology.LabelTopographLeaf: "leaf-0", topology.LabelTopographSpine: "spine-0"}),
		&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "gpu-4-leaf", UID: "t1"},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: celSpec(leaf0)}},
		&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "gpu-4", UID: "t2"},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: celSpec()}},
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "shared", UID: "c1"}, Spec: celSpec(leaf0, spine1)},
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "p-gpus", UID: "c2",
			Annotations: map[string]string{resourceapi.PodResourceClaimAnnotation: "gpus"}}, Spec: celSpec(leaf0)},
		// Written by a controller that did not label it: the data is
		// right, the label the admission policy selects by is missing.
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: nodepin.ConfigMapName},
			Data: map[string]string{"claim.shared": topology.LabelTopographLeaf + "=leaf-0," + topology.LabelTopographSpine + "=spine-1"}},
	)
	f := informers.NewSharedInformerFactory(client, 0)
	s, err := newPinSync(client, f, topology.DefaultLabelMapping())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx.Done())
	go s.run(ctx)

	// data is the namespace's ConfigMap's data, or nil without one; a
	// ConfigMap without the label the admission policy selects it by
	// (topology.LabelClaimNodeSelectors) counts as none.
	data := func(ns string) map[string]string {
		cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, nodepin.ConfigMapName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		if cm.Labels[topology.LabelClaimNodeSelectors] != "true" {
			return map[string]string{"(unlabelled)": fmt.Sprint(cm.Labels)}
		}
		return cm.Data
	}
	eventually := func(what string, want map[string]map[string]string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := map[string]map[string]string{}
			for _, ns := range []string{"ml", "team", "other"} {
				if d := data(ns); d != nil {
					got[ns] = d
				}
			}
			diff := cmp.Diff(want, got)
			if diff == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: ConfigMaps (-want +got):\n%s", what, diff)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	leafKey, spineKey := topology.LabelTopographLeaf, topology.LabelTopographSpine
	eventually("at start", map[string]map[string]string{
		"ml":   {"template.gpu-4-leaf": leafKey + "=leaf-0"},
		"team": {"claim.shared": leafKey + "=leaf-0," + spineKey + "=spine-1"},
	})

	if err := client.ResourceV1().ResourceClaimTemplates("ml").Delete(ctx, "gpu-4-leaf", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("the pinning template deleted", map[string]map[string]string{
		"team": {"claim.shared": leafKey + "=leaf-0," + spineKey + "=spine-1"},
	})

	// A node labelled the older way: no one leaf label selects the
	// nodes the attribute does, so the claim keeps no selector.
	if _, err := client.CoreV1().Nodes().Create(ctx, node("n1", map[string]string{topology.LabelNVIDIALeaf: "leaf-1", topology.LabelTopographSpine: "spine-0"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("leaf labels of two kinds", map[string]map[string]string{})

	// A ConfigMap the controller's lister had not seen when it last
	// synced the namespace (its own create, not yet back through the
	// watch) is synced again when it arrives: here nothing pins, so it goes.
	stale := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: nodepin.ConfigMapName},
		Data: map[string]string{"template.gone": leafKey + "=leaf-0"}}
	if _, err := client.CoreV1().ConfigMaps("other").Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("a ConfigMap that arrives after its namespace was synced", map[string]map[string]string{})
}
