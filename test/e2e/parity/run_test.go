package parity

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// Timeouts. A side has placed a case when every pod is bound; it has
// refused it when a pod is reported unschedulable (kube-scheduler's
// PodScheduled condition, the controller's gputopo.dev/status) and the
// pods are still not all bound a while later: confirmRefusal, or
// confirmAgainst when the other side placed the same case (a refusal
// must then hold longer to count).
const (
	waitPlaced     = 20 * time.Second
	confirmRefusal = 3 * time.Second
	confirmAgainst = 20 * time.Second
	waitGated      = 30 * time.Second // pods created and waiting at the foreign gate
	waitHolder     = 30 * time.Second
	waitCleanup    = 2 * time.Minute
	// waitBindings bounds the wait for kube-scheduler's binding cycles to
	// end: one whose pod's extended-resource claim was deleted before the
	// scheduler saw it waits 120 s for it, holding the pod's devices.
	waitBindings = 150 * time.Second
	pollEvery    = 100 * time.Millisecond
)

// claimName is the pod-level name of every test pod's claim.
const claimName = "gpus"

// side is one way of running a case.
type side struct {
	name  string
	optIn bool   // gputopo.dev/placement: auto on the pods
	short string // in object names
}

var (
	schedulerSide = side{name: "kube-scheduler", short: "s"}
	gputopoSide   = side{name: "gputopo", optIn: true, short: "g"}
)

// statusRefused are the controller's statuses that refuse a group.
var statusRefused = []string{placementapi.StatusUnschedulable, placementapi.StatusInvalidClaim, placementapi.StatusInvalidPlacement}

func caseName(c *caseSpec) string { return fmt.Sprintf("c%03d", c.Index) }

// ---- the case's state ----

// setupState creates what the case holds before its runs: the pods that
// hold GPUs (placed by kube-scheduler, before any taint), the
// DeviceTaintRules, the node taint and the claim template. teardown
// removes all of it and waits until the holders' claims are gone.
func setupState(ctx context.Context, c *caseSpec) (teardown func(context.Context) error, err error) {
	name := caseName(c)
	var holders []types.NamespacedName
	var rules []string
	tainted := ""
	teardown = func(ctx context.Context) error {
		var errs []string
		for _, h := range holders {
			if err := client.CoreV1().Pods(h.Namespace).Delete(ctx, h.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("delete holder pod %s: %v", h, err))
			}
		}
		for _, r := range rules {
			if err := client.ResourceV1().DeviceTaintRules().Delete(ctx, r, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("delete DeviceTaintRule %s: %v", r, err))
			}
		}
		if tainted != "" {
			if err := setNodeTaint(ctx, tainted, false); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if !c.Shared {
			if err := client.ResourceV1().ResourceClaimTemplates(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("delete claim template %s: %v", name, err))
			}
		}
		if len(c.VolumeNodes) > 0 {
			if err := client.CoreV1().PersistentVolumeClaims(c.Namespace).Delete(ctx, volumeName(c), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("delete PersistentVolumeClaim %s: %v", volumeName(c), err))
			}
			if err := client.CoreV1().PersistentVolumes().Delete(ctx, volumeName(c), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("delete PersistentVolume %s: %v", volumeName(c), err))
			}
		}
		for _, h := range holders {
			if err := waitPodAndClaimsGone(ctx, h.Namespace, h.Name); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("clean up the state of case %d: %s", c.Index, strings.Join(errs, "; "))
		}
		return nil
	}
	fail := func(err error) (func(context.Context) error, error) {
		if terr := teardown(ctx); terr != nil {
			return nil, fmt.Errorf("%w; %w", err, terr)
		}
		return nil, err
	}

	for i, h := range c.Holders {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-hold-%d", name, i), Namespace: h.Namespace},
			Spec: corev1.PodSpec{
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				NodeSelector:                  map[string]string{corev1.LabelHostname: h.Node},
				Containers: []corev1.Container{{Name: "hold", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claimName}}}}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: ptr.To(h.Template)}},
			},
		}
		if _, err := client.CoreV1().Pods(h.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fail(fmt.Errorf("create holder pod %s/%s: %w", h.Namespace, pod.Name, err))
		}
		holders = append(holders, types.NamespacedName{Namespace: h.Namespace, Name: pod.Name})
	}
	for _, h := range holders {
		if err := waitHolderPlaced(ctx, h); err != nil {
			return fail(err)
		}
	}
	for i, r := range c.TaintRules {
		sel := &resourcev1.DeviceTaintSelector{Driver: ptr.To(gputopology.DriverName), Pool: ptr.To(r.Node)}
		if r.Device != "" {
			sel.Device = ptr.To(r.Device)
		}
		rule := &resourcev1.DeviceTaintRule{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)},
			Spec: resourcev1.DeviceTaintRuleSpec{DeviceSelector: sel,
				Taint: resourcev1.DeviceTaint{Key: deviceTaintKey, Value: "parity", Effect: resourcev1.DeviceTaintEffectNoSchedule}},
		}
		if _, err := client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
			return fail(fmt.Errorf("create DeviceTaintRule %s: %w", rule.Name, err))
		}
		rules = append(rules, rule.Name)
	}
	if c.TaintedNode != "" {
		tainted = c.TaintedNode
		if err := setNodeTaint(ctx, tainted, true); err != nil {
			return fail(err)
		}
	}
	if len(c.VolumeNodes) > 0 {
		if err := createVolume(ctx, c); err != nil {
			return fail(err)
		}
	}
	if !c.Shared && c.Extended == 0 {
		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace},
			Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: *c.Claim.DeepCopy()},
		}
		if _, err := client.ResourceV1().ResourceClaimTemplates(c.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			return fail(fmt.Errorf("create claim template %s/%s: %w", c.Namespace, name, err))
		}
	}
	return teardown, nil
}

// volumeName names the case's PersistentVolume and its claim.
func volumeName(c *caseSpec) string { return caseName(c) + "-data" }

// createVolume creates the case's volume, a host path its node affinity
// holds to c.VolumeNodes, and a claim bound to it, and waits until they
// are bound.
func createVolume(ctx context.Context, c *caseSpec) error {
	name := volumeName(c)
	const class = "gputopo-parity-manual"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: c.VolumeNodes}}}}}},
		},
	}
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create PersistentVolume %s: %w", name, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(class), VolumeName: name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := client.CoreV1().PersistentVolumeClaims(c.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create PersistentVolumeClaim %s/%s: %w", c.Namespace, name, err)
	}
	phase := ""
	err := poll(ctx, waitHolder, func() bool {
		got, err := client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			phase = err.Error()
			return false
		}
		phase = string(got.Status.Phase)
		return got.Status.Phase == corev1.ClaimBound
	})
	if err != nil {
		return fmt.Errorf("wait for PersistentVolumeClaim %s/%s to be bound: %w; last phase: %s", c.Namespace, name, err, phase)
	}
	return nil
}

// waitHolderPlaced waits until a holder pod is bound with its claim
// allocated.
func waitHolderPlaced(ctx context.Context, h types.NamespacedName) error {
	state := ""
	err := poll(ctx, waitHolder, func() bool {
		p, err := client.CoreV1().Pods(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			state = err.Error()
			return false
		}
		state = framework.PodState(p)
		if p.Spec.NodeName == "" {
			return false
		}
		claim, err := framework.PodClaim(ctx, client, p, claimName)
		if err != nil || claim.Status.Allocation == nil {
			state = fmt.Sprintf("bound to %s, claim not allocated (%v)", p.Spec.NodeName, err)
			return false
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("wait for holder pod %s to be placed: %w; last state: %s", h, err, state)
	}
	return nil
}

// setNodeTaint adds or removes nodeTaintKey:NoSchedule on a node.
func setNodeTaint(ctx context.Context, node string, on bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == nodeTaintKey })
		if on {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: nodeTaintKey, Value: "parity", Effect: corev1.TaintEffectNoSchedule})
		}
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("set taint %s on node %s to %v: %w", nodeTaintKey, node, on, err)
	}
	return nil
}

// ---- one run ----

// runSide runs the case's workload through one side and removes it again.
// other is the other side's outcome when it is known.
func runSide(ctx context.Context, c *caseSpec, sd side, other *outcome) (outcome, error) {
	job := caseName(c) + "-" + sd.short
	shared := ""
	if c.Shared {
		shared = job
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: shared, Namespace: c.Namespace}, Spec: *c.Claim.DeepCopy()}
		if _, err := client.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return outcome{}, fmt.Errorf("create shared claim %s/%s: %w", c.Namespace, shared, err)
		}
	}
	if _, err := client.BatchV1().Jobs(c.Namespace).Create(ctx, newJob(c, job, sd.optIn, shared), metav1.CreateOptions{}); err != nil {
		return outcome{}, fmt.Errorf("create Job %s/%s: %w", c.Namespace, job, err)
	}

	var o outcome
	if c.ForeignGate {
		faults, err := openForeignGates(ctx, c, job, sd.optIn)
		if err != nil {
			return outcome{}, err
		}
		o.Illegal = append(o.Illegal, faults...)
	}
	// A refusal against the other side's placement must hold longer, but
	// not on a shape known to disagree: that wait would only slow the run.
	confirm := confirmRefusal
	if _, isKnown := known(c); other != nil && other.Placed && !isKnown {
		confirm = confirmAgainst
	}
	placed, detail, err := observe(ctx, c, job, sd.optIn, confirm)
	if err != nil {
		return outcome{}, err
	}
	o.Placed, o.Detail = placed, detail
	if err := collect(ctx, c, job, shared, &o); err != nil {
		return outcome{}, err
	}
	if err := deleteRun(ctx, c.Namespace, job, shared); err != nil {
		return outcome{}, err
	}
	return o, nil
}

// newJob is the case's Job: c.Pods pods, each with the case's claim (from
// the case's template, or the shared claim), opted in to gputopo or not.
func newJob(c *caseSpec, name string, optIn bool, shared string) *batchv1.Job {
	podClaim := corev1.PodResourceClaim{Name: claimName, ResourceClaimTemplateName: ptr.To(caseName(c))}
	if shared != "" {
		podClaim = corev1.PodResourceClaim{Name: claimName, ResourceClaimName: ptr.To(shared)}
	}
	var ann map[string]string
	if optIn {
		ann = map[string]string{placementapi.AnnotationPlacement: "auto"}
	}
	spec := corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Containers: []corev1.Container{{Name: "work", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claimName}}}}},
		ResourceClaims: []corev1.PodResourceClaim{podClaim},
	}
	if c.Extended > 0 {
		n := resource.MustParse(strconv.Itoa(c.Extended))
		spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{extendedName: n}, Requests: corev1.ResourceList{extendedName: n}}
		spec.ResourceClaims = nil
	}
	if c.TolerateNodeTaint {
		spec.Tolerations = []corev1.Toleration{{Key: nodeTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}
	if c.Leaf != "" {
		spec.NodeSelector = map[string]string{"fabric.topograph.run/tier-0": c.Leaf}
	}
	if c.ForeignGate {
		spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: foreignGate}}
	}
	if len(c.VolumeNodes) > 0 {
		spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: volumeName(c)}}}}
	}
	if c.Spread {
		spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
			WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.JobNameLabel: name}}}}
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To(int32(c.Pods)),
			Completions:    ptr.To(int32(c.Pods)),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			BackoffLimit:   ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: ann, Labels: map[string]string{"app.kubernetes.io/part-of": "gputopo-parity"}},
				Spec:       spec,
			},
		},
	}
}

// jobPods lists the Job's pods that are not being deleted, by name.
func jobPods(ctx context.Context, ns, job string) ([]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, fmt.Errorf("list pods of Job %s/%s: %w", ns, job, err)
	}
	out := slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// openForeignGates waits until every pod of the Job exists with its claims
// and waits at the foreign gate (opted in: the controller says so), checks
// that no claim of the Job was allocated meanwhile, and removes the
// foreign gate from every pod. It returns what the controller did wrong.
func openForeignGates(ctx context.Context, c *caseSpec, job string, optIn bool) ([]string, error) {
	var pods []corev1.Pod
	state := ""
	err := poll(ctx, waitGated, func() bool {
		var err error
		if pods, err = jobPods(ctx, c.Namespace, job); err != nil {
			state = err.Error()
			return false
		}
		if len(pods) != c.Pods {
			state = fmt.Sprintf("%d of %d pods", len(pods), c.Pods)
			return false
		}
		for _, p := range pods {
			if !c.Shared && c.Extended == 0 && len(p.Status.ResourceClaimStatuses) == 0 {
				state = "pod " + p.Name + " has no claim yet"
				return false
			}
			if s := p.Annotations[placementapi.AnnotationStatus]; optIn && !strings.HasPrefix(s, placementapi.StatusWaitingForGates) {
				state = fmt.Sprintf("pod %s: %s=%q", p.Name, placementapi.AnnotationStatus, s)
				return false
			}
		}
		return true
	})
	var faults []string
	if err != nil {
		if !optIn {
			return nil, fmt.Errorf("wait for the pods of Job %s at gate %s: %w; last state: %s", job, foreignGate, err, state)
		}
		faults = append(faults, fmt.Sprintf("the controller did not report %s within %s: %s", placementapi.StatusWaitingForGates, waitGated, state))
	}
	claims, err := runClaims(ctx, c.Namespace, pods, c.Shared, job)
	if err != nil {
		return nil, err
	}
	for _, cl := range claims {
		if cl.Status.Allocation != nil {
			faults = append(faults, fmt.Sprintf("claim %s allocated while gate %s held its pods", cl.Name, foreignGate))
		}
	}
	for _, p := range pods {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.SchedulingGates = slices.DeleteFunc(cur.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == foreignGate })
			_, err = client.CoreV1().Pods(p.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("remove gate %s from pod %s: %w", foreignGate, p.Name, err)
		}
	}
	return faults, nil
}

// observe waits until the Job's pods are all bound (placed), or a refusal
// was reported and the pods are still not all bound confirm later, or
// waitPlaced passed.
func observe(ctx context.Context, c *caseSpec, job string, optIn bool, confirm time.Duration) (placed bool, detail string, err error) {
	start := time.Now()
	var refusedAt time.Time
	refusal, state := "", ""
	for {
		pods, err := jobPods(ctx, c.Namespace, job)
		if err != nil {
			return false, "", err
		}
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		if bound == c.Pods && len(pods) == c.Pods {
			return true, fmt.Sprintf("%d/%d pods bound in %s", bound, c.Pods, time.Since(start).Round(100*time.Millisecond)), nil
		}
		state = fmt.Sprintf("%d/%d pods bound", bound, c.Pods)
		if r := refusalOf(pods, optIn); r != "" {
			state += "; " + r
			if refusal == "" {
				refusal, refusedAt = r, time.Now()
			}
		}
		now := time.Now()
		switch {
		case refusal != "" && now.Sub(refusedAt) >= confirm:
			return false, state, nil
		case now.Sub(start) >= waitPlaced && (refusal == "" || now.Sub(refusedAt) >= confirm):
			return false, "timeout after " + waitPlaced.String() + ": " + state, nil
		}
		select {
		case <-ctx.Done():
			return false, "", fmt.Errorf("observe Job %s: %w", job, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// refusalOf says why a pod of the Job was refused: the scheduler's
// PodScheduled=False condition (not at a gate), or on an opted-in pod the
// controller's refusing status.
func refusalOf(pods []corev1.Pod, optIn bool) string {
	for _, p := range pods {
		if s := p.Annotations[placementapi.AnnotationStatus]; optIn && s != "" {
			for _, r := range statusRefused {
				if strings.HasPrefix(s, r) {
					return fmt.Sprintf("pod %s: %s=%q", p.Name, placementapi.AnnotationStatus, s)
				}
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason != corev1.PodReasonSchedulingGated {
				return fmt.Sprintf("pod %s: PodScheduled=False %s: %s", p.Name, cond.Reason, cond.Message)
			}
		}
	}
	return ""
}

// podClaims returns the claims of a pod that exist: its claim from the
// case's template and the claim kube-scheduler made for its extended
// resource.
func podClaims(ctx context.Context, p *corev1.Pod) ([]resourcev1.ResourceClaim, error) {
	var names []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names = append(names, *s.ResourceClaimName)
		}
	}
	if s := p.Status.ExtendedResourceClaimStatus; s != nil {
		names = append(names, s.ResourceClaimName)
	}
	var out []resourcev1.ResourceClaim
	for _, name := range names {
		cl, err := client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get claim %s of pod %s: %w", name, p.Name, err)
		}
		out = append(out, *cl)
	}
	return out, nil
}

// runClaims returns the claims of the Job's pods (and the shared claim).
func runClaims(ctx context.Context, ns string, pods []corev1.Pod, shared bool, sharedName string) ([]resourcev1.ResourceClaim, error) {
	var out []resourcev1.ResourceClaim
	if shared {
		cl, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, sharedName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get shared claim %s/%s: %w", ns, sharedName, err)
		}
		return append(out, *cl), nil
	}
	for i := range pods {
		cls, err := podClaims(ctx, &pods[i])
		if err != nil {
			return nil, err
		}
		out = append(out, cls...)
	}
	return out, nil
}

// collect records the devices the run's claims hold and checks them
// against the case's state and every other claim.
func collect(ctx context.Context, c *caseSpec, job, shared string, o *outcome) error {
	pods, err := jobPods(ctx, c.Namespace, job)
	if err != nil {
		return err
	}
	claims, err := runClaims(ctx, c.Namespace, pods, shared != "", shared)
	if err != nil {
		return err
	}
	ours := map[string]bool{}
	for _, cl := range claims {
		ours[cl.Namespace+"/"+cl.Name] = true
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			o.Devices = append(o.Devices, fmt.Sprintf("%s→%s/%s", cl.Name, r.Pool, r.Device))
		}
	}
	sort.Strings(o.Devices)
	o.Devices = slices.Compact(o.Devices)
	var all []resourcev1.ResourceClaim
	for _, ns := range shape.namespaces {
		list, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list claims in %s: %w", ns, err)
		}
		all = append(all, list.Items...)
	}
	o.Illegal = append(o.Illegal, illegal(c, shape, inv, all, ours)...)
	if c.Spread || len(c.VolumeNodes) > 0 {
		faults, err := nodeFaults(ctx, c, pods)
		if err != nil {
			return err
		}
		o.Illegal = append(o.Illegal, faults...)
	}
	return nil
}

// nodeFaults lists what breaks the case's spread constraint or its
// volume's node affinity: two pods of the run on one node, a pod on a
// node its volume leaves out, and a pod kube-scheduler refused on the
// node the controller planned it onto (a Released or Moved event): the
// plan should have weighed both as the scheduler's filters do.
func nodeFaults(ctx context.Context, c *caseSpec, pods []corev1.Pod) ([]string, error) {
	var out []string
	ns := c.Namespace
	on := map[string]string{}
	for _, p := range pods {
		if n := p.Spec.NodeName; n != "" {
			if other, ok := on[n]; ok && c.Spread {
				out = append(out, fmt.Sprintf("pods %s and %s both on %s despite their spread constraint", other, p.Name, n))
			}
			on[n] = p.Name
			if len(c.VolumeNodes) > 0 && !slices.Contains(c.VolumeNodes, n) {
				out = append(out, fmt.Sprintf("pod %s on %s, which its volume's node affinity leaves out", p.Name, n))
			}
		}
		evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
		if err != nil {
			return nil, fmt.Errorf("list events of pod %s/%s: %w", ns, p.Name, err)
		}
		for _, e := range evs.Items {
			if e.Source.Component == "gputopo-controller" && (e.Reason == "Released" || e.Reason == "Moved") {
				out = append(out, fmt.Sprintf("pod %s %s: %s", p.Name, e.Reason, e.Message))
			}
		}
	}
	return out, nil
}

// deleteRun suspends and deletes the Job, force-deletes its pods (pods on
// fake nodes never finish a graceful deletion), deletes the shared claim
// and waits until the pods and every claim of the run are gone.
func deleteRun(ctx context.Context, ns, job, shared string) error {
	suspend := []byte(`{"spec":{"suspend":true}}`)
	if _, err := client.BatchV1().Jobs(ns).Patch(ctx, job, types.MergePatchType, suspend, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("suspend Job %s/%s: %w", ns, job, err)
	}
	if err := client.BatchV1().Jobs(ns).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Job %s/%s: %w", ns, job, err)
	}
	if shared != "" {
		if err := client.ResourceV1().ResourceClaims(ns).Delete(ctx, shared, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete shared claim %s/%s: %w", ns, shared, err)
		}
	}
	state := ""
	err := poll(ctx, waitCleanup, func() bool {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil {
			state = err.Error()
			return false
		}
		var left []string
		for _, p := range list.Items {
			left = append(left, p.Name)
			if err := forceDelete(ctx, &p); err != nil {
				state = err.Error()
				return false
			}
		}
		if len(left) > 0 {
			state = fmt.Sprintf("pods left: %v", left)
			return false
		}
		claims, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			state = err.Error()
			return false
		}
		for _, cl := range claims.Items {
			owned := slices.ContainsFunc(cl.OwnerReferences, func(r metav1.OwnerReference) bool {
				return r.Kind == "Pod" && strings.HasPrefix(r.Name, job+"-")
			})
			if owned || cl.Name == shared {
				left = append(left, cl.Name)
			}
		}
		state = fmt.Sprintf("claims left: %v", left)
		return len(left) == 0
	})
	if err != nil {
		return fmt.Errorf("wait for the pods and claims of Job %s/%s to be gone: %w; last state: %s", ns, job, err, state)
	}
	return waitSchedulerIdle(ctx)
}

// waitSchedulerIdle waits until kube-scheduler runs no binding cycle. A
// deleted pod's cycle can still hold its devices in the scheduler's memory,
// and the next run would then see less free than the cluster shows.
func waitSchedulerIdle(ctx context.Context) error {
	state, start := "", time.Now()
	defer func() {
		if d := time.Since(start); d > time.Second {
			fmt.Printf("    waited %s for kube-scheduler's binding cycles to end\n", d.Round(100*time.Millisecond))
		}
	}()
	err := poll(ctx, waitBindings, func() bool {
		n, err := framework.SchedulerBindingsInFlight(ctx, suite.Cluster)
		if err != nil {
			state = err.Error()
			return false
		}
		state = fmt.Sprintf("%g binding cycles in flight", n)
		return n == 0
	})
	if err != nil {
		return fmt.Errorf("wait for kube-scheduler to finish its binding cycles: %w; last state: %s", err, state)
	}
	return nil
}

// forceDelete deletes a pod with grace period 0, and drops the Job
// controller's tracking finalizer once the Job is gone.
func forceDelete(ctx context.Context, p *corev1.Pod) error {
	if p.DeletionTimestamp == nil || p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != 0 {
		err := client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("force-delete pod %s: %w", p.Name, err)
		}
		return nil
	}
	if len(p.Finalizers) > 0 && time.Since(p.DeletionTimestamp.Time) > 5*time.Second {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if _, err := client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove finalizers of pod %s: %w", p.Name, err)
		}
	}
	return nil
}

// waitPodAndClaimsGone waits until a pod and the claims it owns are gone.
func waitPodAndClaimsGone(ctx context.Context, ns, name string) error {
	state := ""
	err := poll(ctx, waitCleanup, func() bool {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if err := forceDelete(ctx, p); err != nil {
				state = err.Error()
			} else {
				state = "pod still there"
			}
			return false
		}
		if !apierrors.IsNotFound(err) {
			state = err.Error()
			return false
		}
		claims, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			state = err.Error()
			return false
		}
		for _, cl := range claims.Items {
			if slices.ContainsFunc(cl.OwnerReferences, func(r metav1.OwnerReference) bool { return r.Kind == "Pod" && r.Name == name }) {
				state = "claim " + cl.Name + " still there"
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("wait for pod %s/%s and its claims to be gone: %w; last state: %s", ns, name, err, state)
	}
	return nil
}

// poll calls cond every pollEvery until it holds, timeout passes or ctx
// ends.
func poll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
	return nil
}
