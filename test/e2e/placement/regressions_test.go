package placement

// Regression tests for controller bugs this suite found: devices held
// forever by a deleted Job's plan, and a deleted Job's leftover pods planned
// as a smaller group. (This file sorts after placement_test.go, so a
// failure here, which can leave devices held, does not disturb the others.)

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// fakeLeaf is the last leaf without real nodes.
func fakeLeaf(t *testing.T) string {
	t.Helper()
	for i := len(topo.leaves) - 1; i >= 0; i-- {
		l := topo.leaves[i]
		if !slices.ContainsFunc(topo.leafNodes[l], func(n string) bool { return topo.real[n] }) {
			return l
		}
	}
	t.Fatal("every leaf has a real node")
	return ""
}

// TestDeletedJobReleasesDevices places a Job on a leaf, deletes it at once
// and asks for the same leaf again: the leaf is empty, so the second Job
// must be placed there.
//
// Was: the controller kept an in-flight reservation for every plan until
// its next reservations() call sees all of the plan's pods in the informer;
// if the pods are gone by then (the Job was deleted or its pods replaced
// within the 15 s between usage updates, and no other group was planned
// meanwhile), the reservation is never dropped and the devices stay held
// until the controller restarts.
func TestDeletedJobReleasesDevices(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	ann := map[string]string{
		placementapi.AnnotationPlacement:         string(placementapi.PlacementSameLeaf),
		placementapi.AnnotationPreferredDomain:   leaf,
		placementapi.AnnotationPreferredRequired: "true",
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if m, err := scrapeMetrics(context.Background()); err != nil {
			t.Logf("metrics: %v", err)
		} else if v, ok := leafUtilization(m, topo.spineOf[leaf], leaf); ok {
			t.Logf("gputopo_controller_leaf_gpu_utilization of %s: %v", leaf, v)
		}
	})

	createJob(t, "release-a", 4, ann)
	if got := wholeLeaf(t, waitJobPlaced(t, "release-a", 4, waitPlaced)); got != leaf {
		t.Fatalf("release-a went to %s, want %s", got, leaf)
	}
	deleteJob(t, "release-a")

	createJob(t, "release-b", 4, ann)
	// Claims are released within seconds, and a group that did not fit is
	// planned again at least every 30 s.
	if got := wholeLeaf(t, waitJobPlaced(t, "release-b", 4, 2*time.Minute)); got != leaf {
		t.Fatalf("release-b went to %s, want %s", got, leaf)
	}
}

// TestDeletedJobIsNotPlaced deletes a Job that waits because it cannot
// fit, then its pods, as an operator does with `kubectl delete job` and
// `kubectl delete pods --force`: the controller must not place what is
// left of the group while its pods go.
//
// Was: loadGroup took the group size from the Job, and when the Job is
// not found it uses the number of pods left. While a deleted Job's pods
// are removed one by one, the controller sees a group of 4, 3, ... pods
// that now fits, plans it, holds its devices (in-flight, see
// TestDeletedJobReleasesDevices), and pins and ungates pods that are
// being deleted ("pin pod ...: not found" in the controller's log). It is
// a race, so the test tries a few times.
func TestDeletedJobIsNotPlaced(t *testing.T) {
	dumpOnFailure(t)
	for round := range 3 {
		deleteWaitingJob(t, fmt.Sprintf("deleted-waiting-%d", round))
		if t.Failed() {
			break
		}
	}
}

func deleteWaitingJob(t *testing.T, name string) {
	t.Helper()
	job := createJob(t, name, 5, placed(placementapi.PlacementSameLeaf))
	waitJobWarning(t, job, "Unschedulable")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	selector := batchv1.JobNameLabel + "=" + name
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	w, err := client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := client.BatchV1().Jobs(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		_ = client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}

	// Every update of the pods until they are all gone.
	left := map[string]bool{}
	uids := map[types.UID]bool{}
	for _, p := range list.Items {
		left[p.Name] = true
		uids[p.UID] = true
	}
	for len(left) > 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("pod watch ended")
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			if n := p.Annotations[placementapi.AnnotationNode]; n != "" {
				t.Errorf("pod %s of the deleted Job %s was pinned to %s (domain %q)", p.Name, name, n, p.Annotations[placementapi.AnnotationDomain])
			}
			if !hasGate(p) {
				t.Errorf("pod %s of the deleted Job %s lost its gate", p.Name, name)
			}
			if ev.Type == watch.Deleted {
				delete(left, p.Name)
			}
		case <-ctx.Done():
			t.Fatalf("pods of the deleted Job %s still there: %v", name, left)
		}
	}
	// A late sync of the group could still allocate the pods' claims until
	// the garbage collector has deleted them: wait for that, then read
	// what the controller did.
	framework.Eventually(t, waitCleanup, "the claims of the deleted Job "+name+" to be gone", func() (bool, string) {
		claims, err := client.ResourceV1().ResourceClaims(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var owned []string
		for _, c := range claims.Items {
			for _, o := range c.OwnerReferences {
				if uids[o.UID] {
					owned = append(owned, c.Name)
				}
			}
		}
		return len(owned) == 0, fmt.Sprintf("claims left: %v", owned)
	})
	data, err := os.ReadFile(lc.LogPath("controller"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "Allocated the claims of the pod group") && strings.Contains(line, fmt.Sprintf("%s/job/%s\"", namespace, name)) {
			t.Errorf("controller log: %s", line)
		}
	}
}
