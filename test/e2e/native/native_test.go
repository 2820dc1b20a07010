package native

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

const (
	leafKey = cluster.LabelLeaf
	// wait bounds every wait; the conditions, not the bound, synchronise.
	wait = 3 * time.Minute
)

// A gang of two whole-node pods fits in one leaf: native scheduling
// alone places it there, and so does gputopo with the controller
// allocating, the same gang's pods landing within one value of the key.
func TestGangThatFitsAgreesNativeAndGputopo(t *testing.T) {
	ctx := framework.Ctx(t)
	native := gangJob("fit-native", 2, "gpu-8-node", false)
	pods := runJob(ctx, t, native)
	checkOneLeaf(ctx, t, pods)
	checkAllocatedBy(ctx, t, pods, false)
	deleteJob(ctx, t, native)

	withMode(t, "controller")
	both := gangJob("fit-both", 2, "gpu-8-node", true)
	pods = runJob(ctx, t, both)
	checkOneLeaf(ctx, t, pods)
	checkAllocatedBy(ctx, t, pods, true)
	deleteJob(ctx, t, both)
}

// A gang of three whole-node pods fits in no leaf. Native scheduling
// leaves it pending with no GPU held; gputopo refuses it with the
// constraint named and holds no GPU either, where it used to place it
// across two leaves for the scheduler to refuse.
func TestGangThatCannotFitAgreesNativeAndGputopo(t *testing.T) {
	ctx := framework.Ctx(t)
	native := gangJob("nofit-native", 3, "gpu-8-node", false)
	create(ctx, t, native)
	pods := waitPods(ctx, t, native, 3, "the scheduler to report the gang unschedulable", func(p *corev1.Pod) bool {
		return condition(p, corev1.PodScheduled) == corev1.ConditionFalse
	})
	holdsNothing(ctx, t, pods, 5*time.Second)
	deleteJob(ctx, t, native)

	both := gangJob("nofit-both", 3, "gpu-8-node", true)
	create(ctx, t, both)
	pods = waitPods(ctx, t, both, 3, "gputopo to refuse the gang for its topology constraint", func(p *corev1.Pod) bool {
		c := placedCondition(p)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == placement.StatusUnschedulable &&
			strings.Contains(c.Message, "one value of node label "+leafKey)
	})
	// The controller saw the group and said why; for a while after, no
	// claim of it is allocated and no gate opens.
	holdsNothing(ctx, t, pods, 5*time.Second)
	deleteJob(ctx, t, both)
}

// Auto mode: a gang Job opted in to gputopo has its domain chosen by
// gputopo, and kube-scheduler allocates its devices in its pod-group
// cycle: every pod bound in one leaf, every claim allocated without
// gputopo's allocated-by annotation.
func TestSchedulerAllocatesInTheChosenDomain(t *testing.T) {
	ctx := framework.Ctx(t)
	j := gangJob("sched", 4, "gpu-4-nvlink", true)
	j.Spec.Template.Annotations[placement.AnnotationPlacement] = string(placement.PlacementSameLeaf)
	pods := runJob(ctx, t, j)
	checkOneLeaf(ctx, t, pods)
	checkAllocatedBy(ctx, t, pods, false)
	for _, p := range pods {
		if p.Annotations[placement.AnnotationDomain] == "" {
			t.Errorf("pod %s has no %s: gputopo did not choose its domain", p.Name, placement.AnnotationDomain)
		}
	}
	deleteJob(ctx, t, j)
}

// Pods that name a PodGroup of their own, with no Job, are one group:
// the PodGroup's gang size and topology key are the plan's.
func TestPodGroupPodsArePlacedAsOneGroup(t *testing.T) {
	ctx := framework.Ctx(t)
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: namespace},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: leafKey}}},
		}}
	if _, err := client.SchedulingV1beta1().PodGroups(namespace).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.SchedulingV1beta1().PodGroups(namespace).Delete(context.Background(), pg.Name, metav1.DeleteOptions{})
	})
	var names []string
	for i := range 2 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pg-%d", i), Namespace: namespace,
			Annotations: map[string]string{placement.AnnotationPlacement: string(placement.PlacementAuto)}},
			Spec: podSpec("gpu-8-node")}
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(pg.Name)}
		if _, err := client.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	t.Cleanup(func() {
		for _, n := range names {
			_ = client.CoreV1().Pods(namespace).Delete(context.Background(), n, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
	})
	var pods []*corev1.Pod
	framework.Eventually(t, wait, "the PodGroup's pods to bind", func() (bool, string) {
		pods = nil
		for _, n := range names {
			p, err := client.CoreV1().Pods(namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" {
				if err != nil {
					return false, err.Error()
				}
				return false, p.Name + ": " + framework.PodState(p) + " " + p.Annotations[placement.AnnotationStatus]
			}
			pods = append(pods, p)
		}
		return true, ""
	})
	checkOneLeaf(ctx, t, pods)
	for _, p := range pods {
		if p.Annotations[placement.AnnotationDomain] == "" {
			t.Errorf("pod %s has no %s: gputopo did not place the PodGroup", p.Name, placement.AnnotationDomain)
		}
	}
}

// gangJob is a Job of n pods, each with one claim from template, with a
// gang of n held to one leaf (spec.scheduling); optIn adds gputopo's
// placement annotation.
func gangJob(name string, n int32, template string, optIn bool) *batchv1.Job {
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(n), Completions: ptr.To(n), BackoffLimit: ptr.To[int32](0),
			Scheduling: &batchv1.JobSchedulingConfiguration{
				SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{
					Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{MinCount: ptr.To(n)}},
				SchedulingConstraints: &schedulingv1alpha3.WorkloadPodGroupSchedulingConstraints{
					Topology: []schedulingv1alpha3.TopologyConstraint{{Key: leafKey}}},
			},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}, Spec: podSpec(template)},
		},
	}
	j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	if optIn {
		j.Spec.Template.Annotations[placement.AnnotationPlacement] = string(placement.PlacementAuto)
	}
	return j
}

func podSpec(template string) corev1.PodSpec {
	return corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Containers: []corev1.Container{{Name: "c", Image: "localhost/gputopo/busybox:v1",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(template)}},
	}
}

func create(ctx context.Context, t *testing.T, j *batchv1.Job) {
	t.Helper()
	if _, err := client.BatchV1().Jobs(namespace).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Job %s: %v", j.Name, err)
	}
	t.Cleanup(func() { deleteJob(context.Background(), t, j) })
}

// runJob creates the Job and waits until all its pods are bound.
func runJob(ctx context.Context, t *testing.T, j *batchv1.Job) []*corev1.Pod {
	t.Helper()
	create(ctx, t, j)
	pods := waitPods(ctx, t, j, int(*j.Spec.Parallelism), "every pod of Job "+j.Name+" to bind", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	for _, p := range pods {
		// The Job controller named the Job's PodGroup: the workload
		// gates are on, and the scheduler's pod-group cycle placed it.
		if p.Spec.SchedulingGroup == nil || p.Spec.SchedulingGroup.PodGroupName == nil {
			t.Fatalf("pod %s names no PodGroup; are the workload feature gates on?", p.Name)
		}
	}
	return pods
}

// waitPods waits until the Job has n pods and ok holds for each.
func waitPods(ctx context.Context, t *testing.T, j *batchv1.Job, n int, what string, ok func(*corev1.Pod) bool) []*corev1.Pod {
	t.Helper()
	var out []*corev1.Pod
	framework.Eventually(t, wait, what, func() (bool, string) {
		list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + j.Name})
		if err != nil {
			return false, err.Error()
		}
		out = nil
		var states []string
		for i := range list.Items {
			p := &list.Items[i]
			if p.DeletionTimestamp != nil {
				continue
			}
			out = append(out, p)
			if !ok(p) {
				states = append(states, p.Name+": "+framework.PodState(p)+" "+p.Annotations[placement.AnnotationStatus])
			}
		}
		return len(out) == n && len(states) == 0, fmt.Sprintf("%d of %d pods; %s", len(out), n, strings.Join(states, "; "))
	})
	return out
}

// holdsNothing checks, every poll for the window, that no claim of the
// pods is allocated and no pod is bound.
func holdsNothing(ctx context.Context, t *testing.T, pods []*corev1.Pod, window time.Duration) {
	t.Helper()
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		for _, p := range pods {
			cur, err := client.CoreV1().Pods(namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if cur.Spec.NodeName != "" {
				t.Fatalf("pod %s bound to %s; the gang fits in no leaf", cur.Name, cur.Spec.NodeName)
			}
			cl, err := framework.PodClaim(ctx, client, cur, "gpus")
			if err == nil && cl.Status.Allocation != nil {
				t.Fatalf("claim %s of pod %s is allocated (%s): GPUs held for a gang that cannot run", cl.Name, cur.Name, cl.Annotations[placement.AnnotationAllocatedBy])
			}
		}
		time.Sleep(framework.PollEvery)
	}
}

// checkOneLeaf checks that the pods are bound to nodes of one leaf.
func checkOneLeaf(ctx context.Context, t *testing.T, pods []*corev1.Pod) {
	t.Helper()
	leaves := map[string]bool{}
	var where []string
	for _, p := range pods {
		n, err := client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		leaves[n.Labels[leafKey]] = true
		where = append(where, p.Name+"→"+n.Name)
	}
	if len(leaves) != 1 {
		t.Errorf("pods span %d leaves: %s", len(leaves), strings.Join(where, ", "))
	}
}

// checkAllocatedBy checks who allocated the pods' claims: gputopo's
// controller (its allocated-by annotation) or kube-scheduler.
func checkAllocatedBy(ctx context.Context, t *testing.T, pods []*corev1.Pod, controller bool) {
	t.Helper()
	for _, p := range pods {
		var cl *resourcev1.ResourceClaim
		framework.Eventually(t, wait, "claim of "+p.Name+" allocated", func() (bool, string) {
			var err error
			cl, err = framework.PodClaim(ctx, client, p, "gpus")
			if err != nil {
				return false, err.Error()
			}
			return cl.Status.Allocation != nil, "not allocated"
		})
		by := cl.Annotations[placement.AnnotationAllocatedBy]
		if controller && by == "" {
			t.Errorf("claim %s of %s allocated by the scheduler; want gputopo's controller", cl.Name, p.Name)
		}
		if !controller && by != "" {
			t.Errorf("claim %s of %s allocated by gputopo (%s); want kube-scheduler", cl.Name, p.Name, by)
		}
	}
}

// deleteJob suspends the Job, deletes it and its pods at once (the
// nodes are fake: no kubelet confirms a graceful deletion) and waits until
// its pods and claims are gone.
func deleteJob(ctx context.Context, t *testing.T, j *batchv1.Job) {
	t.Helper()
	suspend := []byte(`{"spec":{"suspend":true}}`)
	if _, err := client.BatchV1().Jobs(namespace).Patch(ctx, j.Name, types.MergePatchType, suspend, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("suspend Job %s: %v", j.Name, err)
	}
	err := client.BatchV1().Jobs(namespace).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	framework.Eventually(t, wait, "Job "+j.Name+" and its pods and claims gone", func() (bool, string) {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + j.Name})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if len(p.Finalizers) > 0 {
				patch := []byte(`{"metadata":{"finalizers":null}}`)
				_, _ = client.CoreV1().Pods(namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
			}
			_ = client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
		claims, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, c := range claims.Items {
			if strings.HasPrefix(c.Name, j.Name+"-") {
				n++
			}
		}
		return len(pods.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d claims left", len(pods.Items), n)
	})
}

// withMode restarts the controller with --allocation-mode=mode for the
// rest of the test, and with the suite's flags after it.
func withMode(t *testing.T, mode string) {
	t.Helper()
	if err := lc.StopController(); err != nil {
		t.Fatal(err)
	}
	if err := lc.StartControllerWith("--allocation-mode=" + mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lc.StopController(); err != nil {
			t.Error(err)
		}
		if err := lc.StartController(); err != nil {
			t.Error(err)
		}
	})
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func placedCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == placement.ConditionPlaced {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
