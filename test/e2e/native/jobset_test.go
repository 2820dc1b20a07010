package native

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

var gvrJobSet = schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}

// labelJobSetName is the label the JobSet controller puts on its Jobs and
// their pods (JobSet's, not gputopo's).
const labelJobSetName = "jobset.sigs.k8s.io/jobset-name"

// The real JobSet controller beside the native path: with the workload
// gates on, a native gang Job takes one leaf (kube-scheduler's pod-group
// cycle, its own allocation); then a JobSet of a leader and a worker,
// whole-node each, opted in to gputopo. The Job controller makes no
// PodGroup for Jobs a JobSet owns (JobSet v0.12 delegates none), so the
// JobSet's pods name none and gputopo places them as one JobSet group in
// the other leaf, its controller allocating their claims.
func TestJobSetBesideNativeGang(t *testing.T) {
	ctx := framework.Ctx(t)
	gang := gangJob("js-gang", 2, "gpu-8-node", false)
	gangPods := runJob(ctx, t, gang)
	gangLeaf := leafOf(ctx, t, gangPods)

	js := createJobSet(ctx, t, "jobset.yaml")
	selector := labelJobSetName + "=" + js.GetName()
	var pods []*corev1.Pod
	framework.Eventually(t, wait, "the JobSet's two pods to bind", func() (bool, string) {
		list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		pods = nil
		var states []string
		for i := range list.Items {
			p := &list.Items[i]
			if p.DeletionTimestamp != nil {
				continue
			}
			pods = append(pods, p)
			if p.Spec.NodeName == "" {
				states = append(states, p.Name+": "+framework.PodState(p)+" "+p.Annotations[placement.AnnotationStatus])
			}
		}
		return len(pods) == 2 && len(states) == 0, fmt.Sprintf("%d of 2 pods; %s", len(pods), strings.Join(states, "; "))
	})
	checkOneLeaf(ctx, t, pods)
	if l := leafOf(ctx, t, pods); l == gangLeaf {
		t.Errorf("the JobSet is in %s, the leaf the native gang holds", l)
	}
	for _, p := range pods {
		if p.Spec.SchedulingGroup != nil {
			t.Errorf("pod %s names PodGroup %v; the Job controller should make none for a Job the JobSet owns", p.Name, ptr.Deref(p.Spec.SchedulingGroup.PodGroupName, ""))
		}
		if p.Annotations[placement.AnnotationDomain] == "" {
			t.Errorf("pod %s has no %s: gputopo did not place the JobSet", p.Name, placement.AnnotationDomain)
		}
		cl, err := framework.PodClaim(ctx, client, p, "gpus")
		if err != nil {
			t.Fatal(err)
		}
		if want := namespace + "/jobset/" + js.GetName(); cl.Annotations[placement.AnnotationAllocatedBy] != want {
			t.Errorf("claim %s of pod %s: %s=%q, want %q", cl.Name, p.Name, placement.AnnotationAllocatedBy, cl.Annotations[placement.AnnotationAllocatedBy], want)
		}
	}
	jobs, err := client.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 2 {
		t.Errorf("the JobSet controller made %d Jobs, want 2 (a leader and a worker)", len(jobs.Items))
	}
	pgs, err := client.SchedulingV1beta1().PodGroups(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pg := range pgs.Items {
		if ref := metav1.GetControllerOf(&pg); ref != nil && ref.Kind == "Job" && ref.Name != gang.Name {
			t.Errorf("PodGroup %s is owned by Job %s; only the native gang Job %s should have one", pg.Name, ref.Name, gang.Name)
		}
	}
	t.Logf("native gang %s in %s; JobSet %s: %d pods of %d Jobs in the other leaf", gang.Name, gangLeaf, js.GetName(), len(pods), len(jobs.Items))
}

// leafOf is the leaf of the first pod's node.
func leafOf(ctx context.Context, t *testing.T, pods []*corev1.Pod) string {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(ctx, pods[0].Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[leafKey]
}

// createJobSet creates the JobSet of testdata/file and, when the test
// ends, deletes it and waits until its Jobs' pods and claims are gone.
func createJobSet(ctx context.Context, t *testing.T, file string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &obj.Object); err != nil {
		t.Fatalf("decode testdata/%s: %v", file, err)
	}
	dyn, err := dynamic.NewForConfig(lc.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ri := dyn.Resource(gvrJobSet).Namespace(namespace)
	got, err := ri.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create JobSet %s: %v", obj.GetName(), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		err := ri.Delete(ctx, got.GetName(), metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete JobSet %s: %v", got.GetName(), err)
		}
		selector := labelJobSetName + "=" + got.GetName()
		framework.Eventually(t, wait, "JobSet "+got.GetName()+"'s pods and claims gone", func() (bool, string) {
			pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, err.Error()
			}
			// Fake nodes: no kubelet confirms a graceful deletion.
			for _, p := range pods.Items {
				_ = client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}
			claims, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			n := 0
			for _, c := range claims.Items {
				if strings.HasPrefix(c.Name, got.GetName()+"-") {
					n++
				}
			}
			jobs, err := client.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, err.Error()
			}
			return len(pods.Items) == 0 && n == 0 && len(jobs.Items) == 0,
				fmt.Sprintf("%d pods, %d claims, %d Jobs left", len(pods.Items), n, len(jobs.Items))
		})
	})
	return got
}
