package placement

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestControllerFollowsLabelMapping: the controller watches the label
// mapping ConfigMap. Five whole nodes never fit a leaf of four, so a
// same-leaf Job of five waits; once the mapping reads the spine label as
// the leaf, each spine is one leaf of sixteen nodes and the waiting Job is
// placed in one of them, without being touched.
func TestControllerFollowsLabelMapping(t *testing.T) {
	dumpOnFailure(t)
	job := createJob(t, "remapped", 5, placed(placementapi.PlacementSameLeaf))
	msg := waitJobWarning(t, job, "Unschedulable")
	t.Logf("before the mapping changed: %s", msg)

	cms := client.CoreV1().ConfigMaps("kube-system")
	mapping := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: gputopology.LabelMappingConfigMap},
		Data:       map[string]string{"leaf": cluster.LabelSpine, "spine": ""},
	}
	if _, err := cms.Create(framework.Ctx(t), mapping, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cms.Delete(context.Background(), mapping.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete the label mapping: %v", err)
		}
	})
	pl := waitJobPlaced(t, "remapped", 5, waitPlaced)
	if !strings.HasPrefix(pl.domain, "leaf:spine-") {
		t.Errorf("domain %q, want a spine read as a leaf (leaf:spine-N)", pl.domain)
	}
	spines := map[string]bool{}
	for _, l := range pl.leaves {
		spines[topo.spineOf[l]] = true
	}
	if len(spines) != 1 || !spines[strings.TrimPrefix(pl.domain, "leaf:")] {
		t.Errorf("pods under spines %v, want the one domain %q names", spines, pl.domain)
	}
}
