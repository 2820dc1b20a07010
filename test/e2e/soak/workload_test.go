package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// What the generator creates. Each case lives for a random time and is
// then deleted.
type caseKind string

const (
	// An opted-in Job of 1 to 4 pods, each with a claim from a template.
	kindJob caseKind = "job"
	// An opted-in Job of 2 or 3 pods that all use one user ResourceClaim.
	kindSharedClaimJob caseKind = "shared-claim-job"
	// One opted-in pod that belongs to no Job.
	kindPod caseKind = "opted-in-pod"
	// A GPU pod that does not opt in: kube-scheduler alone places it.
	kindPlain caseKind = "plain-pod"
)

var caseKinds = []caseKind{kindJob, kindSharedClaimJob, kindPod, kindPlain}

// Labels on everything the soak creates.
const (
	labelPartOf = "app.kubernetes.io/part-of"
	partOf      = "gputopo-soak"
	labelCase   = "soak.gputopo.dev/case"
)

// soakCase is one generated workload.
type soakCase struct {
	id        int
	kind      caseKind
	ns, name  string
	pods      int
	template  string
	placement placementapi.Placement // empty for a plain pod
	strategy  placementapi.Strategy  // empty: the default
	lifetime  time.Duration
}

func (c soakCase) String() string {
	s := fmt.Sprintf("%s %s/%s: %d × %s", c.kind, c.ns, c.name, c.pods, c.template)
	if c.placement != "" {
		s += ", placement " + string(c.placement)
	}
	if c.strategy != "" {
		s += ", strategy " + string(c.strategy)
	}
	return s + fmt.Sprintf(", lives %s", c.lifetime)
}

// weighted picks one of the values, each as often as its weight says.
func weighted[T any](r *rand.Rand, choices []T, weights []int) T {
	total := 0
	for _, w := range weights {
		total += w
	}
	n := r.IntN(total)
	for i, w := range weights {
		if n < w {
			return choices[i]
		}
		n -= w
	}
	panic("unreachable")
}

// generate makes case id from the generator's random source: the same
// seed always gives the same sequence of cases.
func generate(r *rand.Rand, id int, namespaces []string) soakCase {
	c := soakCase{id: id, ns: namespaces[r.IntN(len(namespaces))]}
	c.kind = weighted(r, caseKinds, []int{9, 3, 4, 4})
	switch c.kind {
	case kindJob:
		c.pods = 1 + r.IntN(4)
		c.template = weighted(r, []string{"gpu-8-node", "gpu-4-nvlink", "gpu-2-nvlink-pair", "gpu-1", "gpu-share-quarter", "gpu-share-half", "gpu-4-ladder"},
			[]int{3, 3, 2, 2, 2, 1, 1})
	case kindSharedClaimJob:
		c.pods = 2 + r.IntN(2)
		c.template = weighted(r, []string{"gpu-1", "gpu-2-nvlink-pair", "gpu-share-half"}, []int{2, 2, 1})
	case kindPod:
		c.pods = 1
		c.template = weighted(r, []string{"gpu-1", "gpu-2-nvlink-pair", "gpu-4-nvlink", "gpu-8-node", "gpu-share-quarter"}, []int{2, 2, 2, 1, 2})
	case kindPlain:
		c.pods = 1
		c.template = weighted(r, []string{"gpu-1", "gpu-2-nvlink-pair", "gpu-4-nvlink", "gpu-share-quarter"}, []int{3, 2, 1, 2})
	}
	if c.kind != kindPlain {
		c.placement = weighted(r, []placementapi.Placement{placementapi.PlacementAuto, placementapi.PlacementSameLeaf, placementapi.PlacementSameSpine, placementapi.PlacementNone},
			[]int{5, 2, 1, 1})
		if r.IntN(4) == 0 {
			c.strategy = placementapi.Strategies[r.IntN(len(placementapi.Strategies))]
		}
	}
	c.name = fmt.Sprintf("c%04d", id)
	c.lifetime = time.Duration(30+r.IntN(121)) * time.Second
	return c
}

// podSpec is the pod template of a case: a pause container with one claim,
// from the case's template or, for a shared-claim Job, the case's own
// ResourceClaim.
func (c soakCase) podSpec() corev1.PodTemplateSpec {
	ann := map[string]string{}
	if c.placement != "" {
		ann[placementapi.AnnotationPlacement] = string(c.placement)
	}
	if c.strategy != "" {
		ann[placementapi.AnnotationStrategy] = string(c.strategy)
	}
	claim := corev1.PodResourceClaim{Name: "gpus", ResourceClaimTemplateName: ptr.To(c.template)}
	if c.kind == kindSharedClaimJob {
		claim = corev1.PodResourceClaim{Name: "gpus", ResourceClaimName: ptr.To(c.name)}
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: ann, Labels: map[string]string{labelPartOf: partOf, labelCase: c.name}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "work", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{claim},
		},
	}
}

// create makes the case's objects.
func (c soakCase) create(ctx context.Context, client kubernetes.Interface, templates map[string]*resourcev1.ResourceClaimTemplate) error {
	meta := metav1.ObjectMeta{Name: c.name, Namespace: c.ns, Labels: map[string]string{labelPartOf: partOf, labelCase: c.name}}
	tmpl := c.podSpec()
	switch c.kind {
	case kindPod, kindPlain:
		pod := &corev1.Pod{ObjectMeta: meta, Spec: tmpl.Spec}
		pod.Annotations = tmpl.Annotations
		_, err := client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{})
		return err
	case kindSharedClaimJob:
		t := templates[c.template]
		if t == nil {
			return fmt.Errorf("no claim template %s", c.template)
		}
		claim := &resourcev1.ResourceClaim{ObjectMeta: meta, Spec: *t.Spec.Spec.DeepCopy()}
		if _, err := client.ResourceV1().ResourceClaims(c.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	job := &batchv1.Job{ObjectMeta: meta, Spec: batchv1.JobSpec{
		Parallelism:    ptr.To(int32(c.pods)),
		Completions:    ptr.To(int32(c.pods)),
		CompletionMode: ptr.To(batchv1.IndexedCompletion),
		// A pod lost with its node counts as failed; the Job replaces it.
		BackoffLimit: ptr.To[int32](100),
		Template:     tmpl,
	}}
	_, err := client.BatchV1().Jobs(c.ns).Create(ctx, job, metav1.CreateOptions{})
	return err
}

// remove deletes the case's objects: its Job (the garbage collector takes
// the pods) or pod, its pods, and its user claim. Pods are deleted
// gracefully; the soak's sweeper finishes the deletion of those on fake
// nodes, where no kubelet does. Objects already gone are fine.
func (c soakCase) remove(ctx context.Context, client kubernetes.Interface) error {
	ignore := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	switch c.kind {
	case kindPod, kindPlain:
		return ignore(client.CoreV1().Pods(c.ns).Delete(ctx, c.name, metav1.DeleteOptions{}))
	}
	if err := ignore(client.BatchV1().Jobs(c.ns).Delete(ctx, c.name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})); err != nil {
		return err
	}
	if err := client.CoreV1().Pods(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: labelCase + "=" + c.name}); err != nil {
		return err
	}
	if c.kind == kindSharedClaimJob {
		return ignore(client.ResourceV1().ResourceClaims(c.ns).Delete(ctx, c.name, metav1.DeleteOptions{}))
	}
	return nil
}
