package scale

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

// WorkloadGates turn on kube-scheduler's gang and topology placement and
// the Job controller's Workload and PodGroup (all off by default in 1.37).
var WorkloadGates = map[string]bool{
	"GenericWorkload":                 true,
	"WorkloadWithJob":                 true,
	"TopologyAwareWorkloadScheduling": true,
}

// NativeOptions configure the head-to-head benchmark.
type NativeOptions struct {
	Seed        uint64
	Jobs        int
	FillerEvery int
	// Interval between two arrivals of the stream.
	Interval time.Duration
	// Settle ends a path's stream when no pod was bound for this long.
	Settle time.Duration
	// Probes is how many capacity-freed probes each path runs.
	Probes int
	Paths  []string
	// NodesPerLeaf and NodesPerSpine give the size rule's domains;
	// GPUsPerNode the nodes a Job needs.
	NodesPerLeaf, NodesPerSpine, GPUsPerNode int
}

// Native runs the same stream through every path, each on an empty
// cluster, and returns a row per path.
func Native(ctx context.Context, env *Env, opts NativeOptions) ([]NativeRow, error) {
	var tmpls []*resourcev1.ResourceClaimTemplate
	for _, name := range StreamTemplates {
		t, err := specs.ClaimTemplate(name)
		if err != nil {
			return nil, err
		}
		tmpls = append(tmpls, t)
	}
	if err := env.CreateTemplates(ctx, tmpls); err != nil {
		return nil, err
	}
	blocks, err := nvlinkBlocks(ctx, env)
	if err != nil {
		return nil, err
	}
	stream := Stream(opts.Seed, opts.Jobs, opts.FillerEvery)
	var rows []NativeRow
	for _, path := range opts.Paths {
		start := time.Now()
		if err := reset(ctx, env); err != nil {
			return rows, err
		}
		if err := controllerFor(env, path); err != nil {
			return rows, err
		}
		env.Progressf("%s: stream of %d arrivals", path, len(stream))
		row, err := runStream(ctx, env, opts, path, stream, blocks)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", path, err)
		}
		if err := reset(ctx, env); err != nil {
			return rows, err
		}
		freed, err := probeFreed(ctx, env, opts, path)
		if err != nil {
			return rows, fmt.Errorf("%s: capacity-freed probe: %w", path, err)
		}
		row.FreedN = len(freed)
		row.FreedP50 = percentile(freed, 0.5)
		row.Seconds = time.Since(start).Seconds()
		env.Progressf("%s: done in %.0fs: %+v", path, row.Seconds, row)
		rows = append(rows, row)
	}
	return rows, reset(ctx, env)
}

// controllerFor runs gputopo-controller in the path's allocation mode, or
// stops it for the paths that do without it.
func controllerFor(env *Env, path string) error {
	if err := env.Cluster.StopController(); err != nil && !errors.Is(err, cluster.ErrNotRunning) {
		return err
	}
	switch path {
	case PathGputopo:
		return env.Cluster.StartControllerWith("--allocation-mode=controller")
	case PathGputopoGang:
		return env.Cluster.StartControllerWith("--allocation-mode=auto")
	}
	return nil
}

// nativeJob is the stream item as the path submits it.
func nativeJob(path, name string, pods int, template string) *batchv1.Job {
	n := int32(pods)
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(n), Completions: ptr.To(n), BackoffLimit: ptr.To[int32](0),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelWorkload: "native"}, Annotations: map[string]string{}},
				Spec:       podSpec(template),
			},
		},
	}
	gang := func(key string) {
		j.Spec.Scheduling = &batchv1.JobSchedulingConfiguration{SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{
			Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{MinCount: ptr.To(n)}}}
		if key != "" {
			j.Spec.Scheduling.SchedulingConstraints = &schedulingv1alpha3.WorkloadPodGroupSchedulingConstraints{
				Topology: []schedulingv1alpha3.TopologyConstraint{{Key: key}}}
		}
	}
	switch path {
	case PathNativeLeaf:
		gang(cluster.LabelLeaf)
	case PathNativeSpine:
		gang(cluster.LabelSpine)
	case PathGputopo:
		j.Spec.Template.Annotations[placement.AnnotationPlacement] = string(placement.PlacementAuto)
	case PathGputopoGang:
		gang("")
		j.Spec.Template.Annotations[placement.AnnotationPlacement] = string(placement.PlacementAuto)
	}
	return j
}

// tracker follows the path's pods and claims.
type tracker struct {
	mu     sync.Mutex
	pods   cache.Indexer
	claims cache.Indexer
	// bound: pod name → first seen bound; lastBind the latest of them.
	bound    map[string]time.Time
	node     map[string]string
	lastBind time.Time
	stop     context.CancelFunc
}

func track(ctx context.Context, env *Env) (*tracker, error) {
	ctx, cancel := context.WithCancel(ctx)
	t := &tracker{bound: map[string]time.Time{}, node: map[string]string{}, stop: cancel}
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(Namespace))
	pi := f.Core().V1().Pods().Informer()
	ci := f.Resource().V1().ResourceClaims().Informer()
	see := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, seen := t.bound[p.Name]; !seen {
			now := time.Now()
			t.bound[p.Name], t.node[p.Name], t.lastBind = now, p.Spec.NodeName, now
		}
	}
	_, _ = pi.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }})
	t.pods, t.claims = pi.GetIndexer(), ci.GetIndexer()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pi.HasSynced, ci.HasSynced) {
		cancel()
		return nil, fmt.Errorf("sync the pod and claim caches: %w", ctx.Err())
	}
	return t, nil
}

// jobPods lists the cached pods of a Job.
func (t *tracker) jobPods(job string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, o := range t.pods.List() {
		if p := o.(*corev1.Pod); p.Labels[batchv1.JobNameLabel] == job {
			out = append(out, p)
		}
	}
	return out
}

func runStream(ctx context.Context, env *Env, opts NativeOptions, path string, stream []StreamItem, blocks map[string]string) (NativeRow, error) {
	row := NativeRow{Path: path, Leaves: len(env.Leaves)}
	t, err := track(ctx, env)
	if err != nil {
		return row, err
	}
	defer t.stop()
	outs := make([]JobOutcome, len(stream))
	name := func(i int) string { return path + "-" + stream[i].Name }
	// Sample the GPUs held by Jobs not all bound while the stream runs.
	var ts []time.Time
	var held []int
	jobOf := map[string]int{}
	for i := range stream {
		jobOf[name(i)] = i
	}
	sample := func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		boundBy := map[int]int{}
		podJob := map[string]int{}
		for _, o := range t.pods.List() {
			p := o.(*corev1.Pod)
			i, ok := jobOf[p.Labels[batchv1.JobNameLabel]]
			if !ok {
				continue
			}
			podJob[p.Name] = i
			if _, b := t.bound[p.Name]; b {
				boundBy[i]++
			}
		}
		n := 0
		for _, o := range t.claims.List() {
			c := o.(*resourcev1.ResourceClaim)
			if c.Status.Allocation == nil || len(c.OwnerReferences) == 0 {
				continue
			}
			if i, ok := podJob[c.OwnerReferences[0].Name]; ok && boundBy[i] < stream[i].Pods {
				n += len(c.Status.Allocation.Devices.Results)
			}
		}
		ts, held = append(ts, time.Now()), append(held, n)
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		_ = wait.PollUntilContextCancel(sampleCtx, 500*time.Millisecond, true, func(context.Context) (bool, error) { sample(); return false, nil })
	}()
	defer stopSampling()

	begin := time.Now()
	for i, it := range stream {
		if at := begin.Add(opts.Interval * time.Duration(i)); time.Until(at) > 0 {
			select {
			case <-time.After(time.Until(at)):
			case <-ctx.Done():
				return row, ctx.Err()
			}
		}
		outs[i].Item, outs[i].Created = it, time.Now()
		if it.Filler {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name(i), Namespace: Namespace, Labels: map[string]string{LabelWorkload: "filler"}},
				Spec: podSpec(it.Template)}
			if _, err := env.Client.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				return row, fmt.Errorf("create filler pod %s: %w", p.Name, err)
			}
			continue
		}
		if _, err := env.Client.BatchV1().Jobs(Namespace).Create(ctx, nativeJob(path, name(i), it.Pods, it.Template), metav1.CreateOptions{}); err != nil {
			return row, fmt.Errorf("create Job %s: %w", name(i), err)
		}
	}
	created := time.Now()
	// Settle: every Job bound, or no bind for Settle since the last create.
	_ = wait.PollUntilContextCancel(ctx, time.Second, false, func(context.Context) (bool, error) {
		t.mu.Lock()
		last := t.lastBind
		t.mu.Unlock()
		if last.Before(created) {
			last = created
		}
		return allBound(t, stream, name) || time.Since(last) > opts.Settle, nil
	})
	stopSampling()
	<-sampled
	end := time.Now()
	row.HeldGPUSeconds = HeldIntegral(ts, held, end)

	t.mu.Lock()
	defer t.mu.Unlock()
	usedLeaves := map[string]bool{}
	leafOf, spineOf := map[string]string{}, map[string]string{}
	for _, n := range env.Nodes {
		leafOf[n.Name], spineOf[n.Name] = n.Leaf, n.Spine
	}
	for pod, node := range t.node {
		if _, ok, _ := t.pods.GetByKey(Namespace + "/" + pod); ok {
			usedLeaves[leafOf[node]] = true
		}
	}
	row.LeavesFree = len(env.Leaves) - len(usedLeaves)
	for i, it := range stream {
		o := &outs[i]
		if it.Filler {
			continue
		}
		o.Leaves, o.Spines = map[string]bool{}, map[string]bool{}
		var last time.Time
		for _, p := range t.jobPods(name(i)) {
			if at, b := t.bound[p.Name]; b {
				o.BoundPods++
				o.Leaves[leafOf[t.node[p.Name]]], o.Spines[spineOf[t.node[p.Name]]] = true, true
				if at.After(last) {
					last = at
				}
			}
			if why, ok := refusal(p); ok {
				o.Refused = true
				if o.Why == "" {
					o.Why = why
				}
			}
		}
		if o.BoundPods == it.Pods {
			o.Bound = last
		}
	}
	Summarize(&row, outs, opts.GPUsPerNode, opts.NodesPerLeaf, opts.NodesPerSpine)
	for i, o := range outs {
		if o.Refused && o.Bound.IsZero() {
			env.Progressf("Job %s (%d × %s) refused: %s", name(i), stream[i].Pods, stream[i].Template, o.Why)
		}
	}
	// NVLink quads: the allocated four-GPU claims and whether their GPUs
	// share one NVLink block.
	for _, o := range t.claims.List() {
		c := o.(*resourcev1.ResourceClaim)
		if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 4 {
			continue
		}
		row.Quads++
		set := map[string]bool{}
		for _, r := range c.Status.Allocation.Devices.Results {
			set[blocks[r.Pool+"/"+r.Device]] = true
		}
		if len(set) == 1 && !set[""] {
			row.Contiguous++
		}
	}
	return row, nil
}

func allBound(t *tracker, stream []StreamItem, name func(int) string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, it := range stream {
		if it.Filler {
			continue
		}
		n := 0
		for _, p := range t.jobPods(name(i)) {
			if _, b := t.bound[p.Name]; b {
				n++
			}
		}
		if n < it.Pods {
			return false
		}
	}
	return true
}

// refusal: the scheduler or gputopo said the pod cannot be placed now,
// and why.
func refusal(p *corev1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return "kube-scheduler: " + c.Message, true
		}
		if c.Type == placement.ConditionPlaced && c.Status == corev1.ConditionFalse && c.Reason == placement.StatusUnschedulable {
			return "gputopo: " + c.Message, true
		}
	}
	return "", false
}

// waiting: the pod exists unbound and whoever places it has looked at it.
func waiting(p *corev1.Pod) bool {
	if p.Spec.NodeName != "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if (c.Type == corev1.PodScheduled || c.Type == placement.ConditionPlaced) && c.Status == corev1.ConditionFalse {
			return true
		}
	}
	return false
}

// probeFreed fills every node with a whole-node pod, then per probe
// creates a Job of four whole-node pods in the path's way, waits until it
// is seen waiting, deletes the fillers of four nodes of one leaf and times
// the Job's pods until all are bound.
func probeFreed(ctx context.Context, env *Env, opts NativeOptions, path string) ([]float64, error) {
	t, err := track(ctx, env)
	if err != nil {
		return nil, err
	}
	defer t.stop()
	const size = 4
	byLeaf := map[string][]string{}
	err = parallel(ctx, len(env.Nodes), 16, func(ctx context.Context, i int) error {
		n := env.Nodes[i]
		s := podSpec("gpu-8-node")
		s.NodeSelector = map[string]string{corev1.LabelHostname: n.Name}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "block-" + n.Name, Namespace: Namespace, Labels: map[string]string{LabelWorkload: "block"}}, Spec: s}
		_, err := env.Client.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fill the nodes: %w", err)
	}
	for _, n := range env.Nodes {
		byLeaf[n.Leaf] = append(byLeaf[n.Leaf], "block-"+n.Name)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.bound) >= len(env.Nodes), nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for the %d blocker pods to bind: %w", len(env.Nodes), err)
	}
	var out []float64
	for r := range min(opts.Probes, len(env.Leaves)) {
		job := fmt.Sprintf("%s-probe-%d", path, r)
		if _, err := env.Client.BatchV1().Jobs(Namespace).Create(ctx, nativeJob(path, job, size, "gpu-8-node"), metav1.CreateOptions{}); err != nil {
			return out, fmt.Errorf("create Job %s: %w", job, err)
		}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
			t.mu.Lock()
			defer t.mu.Unlock()
			ps := t.jobPods(job)
			if len(ps) < size {
				return false, nil
			}
			for _, p := range ps {
				if !waiting(p) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			return out, fmt.Errorf("wait for Job %s to be seen waiting: %w", job, err)
		}
		blockers := byLeaf[env.Leaves[r]]
		freed := time.Now()
		for _, b := range blockers[:size] {
			if err := env.Client.CoreV1().Pods(Namespace).Delete(ctx, b, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				return out, fmt.Errorf("delete blocker %s: %w", b, err)
			}
		}
		var done time.Time
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
			t.mu.Lock()
			defer t.mu.Unlock()
			ps := t.jobPods(job)
			n := 0
			for _, p := range ps {
				if at, b := t.bound[p.Name]; b {
					n++
					if at.After(done) {
						done = at
					}
				}
			}
			return n == size, nil
		})
		if err != nil {
			env.Progressf("%s: Job %s not bound within 3 minutes of the capacity freed", path, job)
			continue
		}
		out = append(out, done.Sub(freed).Seconds())
	}
	sort.Float64s(out)
	return out, nil
}

// reset deletes every Job, pod and claim of the benchmark namespace and
// waits until they are gone, so the next path starts on an empty cluster.
func reset(ctx context.Context, env *Env) error {
	bg := metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}
	if err := env.Client.BatchV1().Jobs(Namespace).DeleteCollection(ctx, bg, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete Jobs: %w", err)
	}
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	return wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := env.Client.CoreV1().Pods(Namespace).DeleteCollection(ctx, now, metav1.ListOptions{}); err != nil {
			return false, fmt.Errorf("delete pods: %w", err)
		}
		pods, err := env.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims, err := env.Client.ResourceV1().ResourceClaims(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		jobs, err := env.Client.BatchV1().Jobs(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(pods.Items)+len(claims.Items)+len(jobs.Items) == 0, nil
	})
}

// nvlinkBlocks maps "pool/device" to the device's NVLink block of four.
func nvlinkBlocks(ctx context.Context, env *Env) (map[string]string, error) {
	l, err := env.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	out := map[string]string{}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[topology.AttrNVLinkBlock4]; ok && a.StringValue != nil {
				out[s.Spec.Pool.Name+"/"+d.Name] = *a.StringValue
			}
		}
	}
	return out, nil
}
