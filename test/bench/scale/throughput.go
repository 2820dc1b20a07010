package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/nodepin"
)

// ThroughputOptions configure the scheduler throughput benchmark.
type ThroughputOptions struct {
	// Pods per workload.
	Pods int
	// Mix is the topology workload's demo templates with weights.
	Mix []Weighted
	// Rounds of both workloads; odd rounds run the count-only one first,
	// so neither always meets a fresher cluster.
	Rounds int
	// Stall ends a workload when no pod was bound for this long.
	Stall time.Duration
	// Creators are the goroutines creating pods.
	Creators int
	// NodeSelectors: the controller and the gputopo-claim-node-selector
	// admission policy run, so pods whose claims pin a leaf in CEL get the
	// node selector; the run waits for the policy to act before it starts.
	NodeSelectors bool
}

// WorkloadResult is one workload's run.
type WorkloadResult struct {
	Workload string
	Round    int
	Pods     int
	GPUs     int
	Bound    int
	// CreateSeconds: from the first create request to the last one's reply.
	CreateSeconds float64
	// Seconds: from the first create request to the last pod bound.
	Seconds       float64
	PodsPerSecond float64
	// Latency of a pod from its create request to its binding (seconds).
	LatencyP50, LatencyP99 float64
	Sched                  SchedStats
	CleanupSeconds         float64
}

// SchedStats are kube-scheduler's own figures over one workload.
type SchedStats struct {
	Attempts map[string]float64 // by result
	// AlgorithmMean is the mean time of a pod's filter and score phases,
	// the serial part of a scheduling cycle (seconds).
	AlgorithmMean float64
	// ExtensionPoint is the mean time of each extension point per pod
	// (seconds); Filter covers every node the pod was checked against.
	ExtensionPoint map[string]float64
	// DRA is the DynamicResources plugin's mean time by extension point,
	// per node for Filter (seconds; the scheduler samples plugin timings).
	DRA map[string]float64
	// CPU is the CPU seconds each control plane process used during the
	// workload; unlike wall-clock figures it does not depend on what else
	// shares the machine.
	CPU map[string]float64
}

// Throughput runs both workloads Rounds times and returns every run.
func Throughput(ctx context.Context, env *Env, opts ThroughputOptions) ([]WorkloadResult, error) {
	topo, count, err := TopologyAndCount(opts.Mix, opts.Pods, env.Leaves)
	if err != nil {
		return nil, err
	}
	if topo.GPUs > env.GPUs {
		return nil, fmt.Errorf("%d pods ask for %d GPUs, more than the %d published: pods that cannot fit would end each workload only after the stall timeout; ask for fewer pods", opts.Pods, topo.GPUs, env.GPUs)
	}
	if err := env.CreateTemplates(ctx, append(topo.Templates, count.Templates...)); err != nil {
		return nil, err
	}
	if opts.NodeSelectors {
		if err := waitNodeSelectors(ctx, env, topo.Templates); err != nil {
			return nil, err
		}
	}
	scr, err := NewScraper(env)
	if err != nil {
		return nil, err
	}
	env.Progressf("workloads: %d pods each, %d GPUs each of %d published", opts.Pods, topo.GPUs, env.GPUs)
	var out []WorkloadResult
	for round := range opts.Rounds {
		plans := []PodPlan{topo, count}
		if round%2 == 1 {
			plans = []PodPlan{count, topo}
		}
		for _, p := range plans {
			r, err := runWorkload(ctx, env, scr, p, opts)
			if err != nil {
				return out, err
			}
			r.Round = round
			env.Progressf("round %d %s: %d/%d pods bound in %.1fs: %.1f pods/s (created in %.1fs; latency p50 %.1fs p99 %.1fs); cleanup %.1fs",
				round, r.Workload, r.Bound, r.Pods, r.Seconds, r.PodsPerSecond, r.CreateSeconds, r.LatencyP50, r.LatencyP99, r.CleanupSeconds)
			out = append(out, r)
		}
	}
	return out, nil
}

func runWorkload(ctx context.Context, env *Env, scr *Scraper, plan PodPlan, opts ThroughputOptions) (WorkloadResult, error) {
	res := WorkloadResult{Workload: plan.Workload, Pods: len(plan.Pods), GPUs: plan.GPUs}
	before, err := scr.Scheduler(ctx)
	if err != nil {
		return res, err
	}
	w := newBindWatch(ctx, env, plan.Workload)
	defer w.stop()
	cpuBefore := Memory(env.Cluster.Dir(), ControlPlane...)

	start := time.Now()
	created := make([]time.Time, len(plan.Pods))
	err = parallel(ctx, len(plan.Pods), opts.Creators, func(ctx context.Context, i int) error {
		created[i] = time.Now()
		pod := NewPod(fmt.Sprintf("%s-%05d", plan.Workload, i), plan.Workload, plan.Pods[i], plan.Leaves[i])
		if _, err := env.Client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", pod.Name, err)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.CreateSeconds = time.Since(start).Seconds()
	bound := w.wait(ctx, len(plan.Pods), opts.Stall)

	after, err := scr.Scheduler(ctx)
	if err != nil {
		return res, err
	}
	res.Sched = schedStats(before, after)
	res.Sched.CPU = cpuDelta(cpuBefore, Memory(env.Cluster.Dir(), ControlPlane...))
	var last time.Time
	var lat []float64
	for i := range plan.Pods {
		if t, ok := bound[fmt.Sprintf("%s-%05d", plan.Workload, i)]; ok {
			lat = append(lat, t.Sub(created[i]).Seconds())
			if t.After(last) {
				last = t
			}
		}
	}
	res.Bound = len(lat)
	if res.Bound > 0 {
		res.Seconds = last.Sub(start).Seconds()
		res.PodsPerSecond = float64(res.Bound) / res.Seconds
		res.LatencyP50, res.LatencyP99 = percentile(lat, 0.5), percentile(lat, 0.99)
	}
	cleanStart := time.Now()
	if err := cleanup(ctx, env, LabelWorkload+"="+plan.Workload); err != nil {
		return res, err
	}
	res.CleanupSeconds = time.Since(cleanStart).Seconds()
	return res, nil
}

// bindWatch records when each pod of a workload was first seen bound.
type bindWatch struct {
	mu     sync.Mutex
	bound  map[string]time.Time
	lastAt time.Time
	cancel context.CancelFunc
}

func newBindWatch(ctx context.Context, env *Env, workload string) *bindWatch {
	w := &bindWatch{bound: map[string]time.Time{}, lastAt: time.Now()}
	ctx, w.cancel = context.WithCancel(ctx)
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelWorkload + "=" + workload }))
	inf := f.Core().V1().Pods().Informer()
	see := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			w.mark(p.Name)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return w
}

func (w *bindWatch) mark(name string) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, seen := w.bound[name]; !seen {
		w.bound[name] = now
		w.lastAt = now
	}
}

// wait returns once n pods are bound, or no pod was bound for stall.
func (w *bindWatch) wait(ctx context.Context, n int, stall time.Duration) map[string]time.Time {
	_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.bound) >= n || time.Since(w.lastAt) > stall, nil
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]time.Time, len(w.bound))
	for k, v := range w.bound {
		out[k] = v
	}
	return out
}

func (w *bindWatch) stop() { w.cancel() }

// cleanup force-deletes the selected pods (pods on fake nodes never finish
// deleting otherwise) and every claim in the namespace, and waits until
// they are gone, so that the next workload finds every GPU free.
func cleanup(ctx context.Context, env *Env, selector string) error {
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	pods := env.Client.CoreV1().Pods(Namespace)
	claims := env.Client.ResourceV1().ResourceClaims(Namespace)
	if err := pods.DeleteCollection(ctx, now, metav1.ListOptions{LabelSelector: selector}); err != nil {
		return fmt.Errorf("delete pods %s: %w", selector, err)
	}
	gone := func(list func(context.Context) (int, error)) wait.ConditionWithContextFunc {
		return func(ctx context.Context) (bool, error) {
			n, err := list(ctx)
			return err == nil && n == 0, nil
		}
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, gone(func(ctx context.Context) (int, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector, Limit: 1})
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	}))
	if err != nil {
		return fmt.Errorf("wait for pods %s to be gone: %w", selector, err)
	}
	if err := claims.DeleteCollection(ctx, now, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete claims: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, gone(func(ctx context.Context) (int, error) {
		l, err := claims.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	}))
	if err != nil {
		return fmt.Errorf("wait for the claims of pods %s to be gone: %w", selector, err)
	}
	return nil
}

// cpuDelta is the CPU seconds each process used between two readings.
func cpuDelta(before, after []ProcStat) map[string]float64 {
	out := map[string]float64{}
	for _, a := range after {
		for _, b := range before {
			if a.Name == b.Name && a.PID == b.PID {
				out[a.Name] = a.CPUSeconds - b.CPUSeconds
			}
		}
	}
	return out
}

func schedStats(before, after Metrics) SchedStats {
	s := SchedStats{Attempts: map[string]float64{}, ExtensionPoint: map[string]float64{}, DRA: map[string]float64{}}
	b, a := before.SumBy("scheduler_schedule_attempts_total", nil, "result"), after.SumBy("scheduler_schedule_attempts_total", nil, "result")
	for k, v := range a {
		if d := v - b[k]; d > 0 {
			s.Attempts[k] = d
		}
	}
	const algo = "scheduler_scheduling_algorithm_duration_seconds"
	s.AlgorithmMean = after.Histogram(algo, nil).Sub(before.Histogram(algo, nil)).Mean()
	const ext = "scheduler_framework_extension_point_duration_seconds"
	hb, ha := before.HistogramBy(ext, nil, "extension_point"), after.HistogramBy(ext, nil, "extension_point")
	for k, h := range ha {
		if d := h.Sub(hb[k]); d.Count > 0 {
			s.ExtensionPoint[k] = d.Mean()
		}
	}
	const plugin = "scheduler_plugin_execution_duration_seconds"
	dra := map[string]string{"plugin": "DynamicResources"}
	hb, ha = before.HistogramBy(plugin, dra, "extension_point"), after.HistogramBy(plugin, dra, "extension_point")
	for k, h := range ha {
		if d := h.Sub(hb[k]); d.Count > 0 {
			s.DRA[k] = d.Mean()
		}
	}
	return s
}

// waitNodeSelectors waits until the controller has written the node
// selector of every template that pins a tier and the admission policy
// gives it to a pod (a dry run of a pod of each such template).
func waitNodeSelectors(ctx context.Context, env *Env, tmpls []*resourcev1.ResourceClaimTemplate) error {
	start := time.Now()
	var pinning []string
	for _, t := range tmpls {
		if len(nodepin.FromClaim(&t.Spec.Spec)) > 0 {
			pinning = append(pinning, t.Name)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, name := range pinning {
		err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			pod := NewPod("probe", "probe", name, "")
			got, err := env.Client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil && len(got.Spec.NodeSelector) > 0, nil
		})
		if err != nil {
			return fmt.Errorf("no node selector for pods of template %s after %s: is the controller running with --claim-node-selectors and the gputopo-claim-node-selector policy applied? %w", name, time.Since(start).Round(time.Second), err)
		}
	}
	env.Progressf("node selectors of %d pinning templates in effect after %.1fs", len(pinning), time.Since(start).Seconds())
	return nil
}
