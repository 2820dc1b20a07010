package scale

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/demo/specs"
)

// ShapeTemplates is the demo template a Job's pods use, by GPUs per pod.
var ShapeTemplates = map[int]string{1: "gpu-1", 2: "gpu-2-nvlink-pair", 4: "gpu-4-nvlink", 8: "gpu-8-node"}

// Shape is a Job's size: Pods pods of GPUs GPUs each.
type Shape struct{ Pods, GPUs int }

func (s Shape) String() string { return fmt.Sprintf("%dx%d", s.Pods, s.GPUs) }

// ParseShape parses "PODSxGPUS", e.g. "16x8".
func ParseShape(s string) (Shape, error) {
	p, g, ok := strings.Cut(s, "x")
	pods, err1 := strconv.Atoi(p)
	gpus, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || pods < 1 {
		return Shape{}, fmt.Errorf("job shape %q: want PODSxGPUS, e.g. 16x8", s)
	}
	if _, known := ShapeTemplates[gpus]; !known {
		return Shape{}, fmt.Errorf("job shape %q: %d GPUs per pod has no claim template; use 1, 2, 4 or 8", s, gpus)
	}
	return Shape{Pods: pods, GPUs: gpus}, nil
}

// Paths a burst of Jobs can take besides PathGputopo (each pod one claim
// from the shape's demo template, the Job handed to the gputopo
// controller): kube-scheduler alone, to say how much of the time is
// gputopo's.
const (
	// PathCountOnly: the same Jobs with each pod's claim asking for the
	// same number of GPUs and nothing else, placed by kube-scheduler alone;
	// no gputopo controller runs.
	PathCountOnly = "count-only"
	// PathNoClaims: the same Jobs with pods that ask for no device: what
	// the Job controller and kube-scheduler alone take to create and bind
	// that many pods on the machine, the floor of every other path.
	PathNoClaims = "no-claims"
)

// BurstPaths lists the paths of the controller benchmark, the default first.
var BurstPaths = []string{PathGputopo, PathCountOnly, PathNoClaims}

// ControllerOptions configure the controller benchmark.
type ControllerOptions struct {
	Jobs int
	// Path is how the Jobs are placed: one of BurstPaths ("" is
	// PathGputopo).
	Path string
	// Mix is Job shapes with weights.
	Mix []Weighted
	// Settle ends the run when no Job was bound for this long.
	Settle   time.Duration
	Creators int
	// Spread, when set, creates the Jobs one after the other over this
	// long, evenly, instead of at once: a stream of arrivals.
	Spread time.Duration
	// Hold, when set, lets every Job run this long once all its pods are
	// bound; then the benchmark deletes it and its pods, as if it had
	// completed, and its GPUs free up for the Jobs still waiting.
	Hold time.Duration
	// ProfileDir, when set, receives the controller's Go profiles: CPU
	// from the first create for ProfileFor, then its heap, mutex and
	// block profiles at the end of the run; and kube-apiserver's CPU
	// profile over the controller's window. The controller must run with
	// --profiling --contention-profiling (RunConfig adds them).
	ProfileDir string
	ProfileFor time.Duration
	// TraceFor, when set with ProfileDir, also records the controller's
	// Go execution trace from the first create for this long: where its
	// goroutines waited (for a CPU, on GC, on the network) while planning.
	TraceFor time.Duration
}

// ControllerResult is one controller run.
type ControllerResult struct {
	// Path is the path the Jobs took (BurstPaths).
	Path             string
	Jobs, Pods, GPUs int
	JobsBound        int
	PodsBound        int
	// CreateSeconds: first Job create request to the last one's reply.
	CreateSeconds float64
	// AllBoundSeconds: first Job create request to the last Job bound.
	AllBoundSeconds float64
	// Wait of a Job from its create request to its last pod bound.
	WaitP50, WaitP99, WaitMax float64
	WaitMaxJob                string
	// MaxOvertaken is the most Jobs created after one Job that were bound
	// before it, and that Job.
	MaxOvertaken    int
	MaxOvertakenJob string
	// Demand is the GPUs asked for over the cluster's GPUs.
	Demand float64
	// HoldSeconds is ControllerOptions.Hold; Completed counts the Jobs
	// deleted after it.
	HoldSeconds float64
	Completed   int
	// WaitMaxByShape is the longest wait of the Jobs of each shape.
	WaitMaxByShape map[string]float64
	// MaxBehind is the longest a Job waited after a Job created later
	// was bound: how long it waited behind later arrivals.
	MaxBehind    float64
	MaxBehindJob string
	// MaxBehindOnItsNodes is the same counting only later Jobs bound, while
	// it waited, to a node it was bound to in the end: how long backfill
	// delayed it by taking room it then had to wait for. Zero when no later
	// Job ever took such room.
	MaxBehindOnItsNodes    float64
	MaxBehindOnItsNodesJob string
	// Unbound lists the Jobs not bound by the end, by shape.
	Unbound map[string]int
	// Histograms are the controller's own, per series, over the run.
	Histograms []HistSummary
	Decisions  map[string]float64
	// Writes are the apiserver's mutating requests during the run by
	// "VERB resource[/subresource]", from apiserver_request_total.
	Writes map[string]float64
	// WritesByClient are the same from the audit log, by client.
	WritesByClient map[string]map[string]int
	// Stages splits the pods' waits at the writes that end each stage
	// (PodStages).
	Stages []StageSummary
	// ControllerCPU is the controller's CPU seconds during the run.
	ControllerCPU float64
	Memory        []ProcStat
	// Planner sums the planner regions of the controller's execution trace
	// (ControllerOptions.TraceFor) and SlowPlanner breaks down the slowest
	// of them over half the plan goal.
	Planner     RegionStats
	SlowPlanner []TraceRegion
}

// HistSummary is one histogram series over a run.
type HistSummary struct {
	Name, Labels        string
	Count               float64
	Mean, P50, P90, P99 float64
	// OverGoal counts the observations above the plan goal
	// (PlanGoal), exact from the bucket bound there; -1 for a
	// histogram without that bound.
	OverGoal float64
}

// jobInfo is what the benchmark tracks of one Job.
type jobInfo struct {
	name    string
	shape   Shape
	created time.Time
	bound   map[string]bool
	done    time.Time
	// nodes are the nodes its pods were bound to, with the time of the
	// first bind there.
	nodes map[string]time.Time
}

// Controller creates the Jobs at once and follows them until every Job is
// bound or none was bound for Settle.
func Controller(ctx context.Context, env *Env, opts ControllerOptions) (ControllerResult, error) {
	res := ControllerResult{Path: opts.Path}
	if res.Path == "" {
		res.Path = PathGputopo
	}
	path := res.Path
	shapes := map[string]Shape{}
	for _, m := range opts.Mix {
		s, err := ParseShape(m.Name)
		if err != nil {
			return res, err
		}
		shapes[m.Name] = s
	}
	tmpls, err := pathTemplates(path)
	if err != nil {
		return res, err
	}
	if err := env.CreateTemplates(ctx, slices.Collect(maps.Values(tmpls))); err != nil {
		return res, err
	}
	gputopo := path == PathGputopo
	jobs := make([]*jobInfo, opts.Jobs)
	byName := map[string]*jobInfo{}
	for i, name := range Sequence(opts.Mix, opts.Jobs) {
		s := shapes[name]
		jobs[i] = &jobInfo{name: fmt.Sprintf("job-%04d-%s", i, s), shape: s, bound: map[string]bool{}}
		byName[jobs[i].name] = jobs[i]
		res.Pods += s.Pods
		res.GPUs += s.Pods * s.GPUs
	}
	res.Jobs = len(jobs)
	res.Demand = float64(res.GPUs) / float64(max(env.GPUs, 1))
	res.HoldSeconds = opts.Hold.Seconds()
	env.Progressf("%d Jobs, %d pods, %d of %d GPUs", res.Jobs, res.Pods, res.GPUs, env.GPUs)

	scr, err := NewScraper(env)
	if err != nil {
		return res, err
	}
	apiBefore, err := scr.APIServer(ctx)
	if err != nil {
		return res, err
	}
	var ctlBefore Metrics
	var cpuBefore ProcStat
	if gputopo {
		if ctlBefore, err = scr.Controller(ctx); err != nil {
			return res, err
		}
		if cpuBefore, err = ClusterProc(env.Cluster.Dir(), "controller"); err != nil {
			return res, err
		}
	}

	var mu sync.Mutex
	lastDone := time.Now()
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	var completeErr error
	complete := func(name string) {
		err := completeJob(watchCtx, env, name)
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			res.Completed++
		} else if completeErr == nil && watchCtx.Err() == nil {
			completeErr = err
		}
	}
	f := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(Namespace))
	see := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		j := byName[p.Labels[batchv1.JobNameLabel]]
		if j == nil || !j.done.IsZero() {
			return
		}
		j.bound[p.Name] = true
		if j.nodes == nil {
			j.nodes = map[string]time.Time{}
		}
		if _, seen := j.nodes[p.Spec.NodeName]; !seen {
			j.nodes[p.Spec.NodeName] = time.Now()
		}
		if len(j.bound) == j.shape.Pods {
			j.done = time.Now()
			lastDone = j.done
			if opts.Hold > 0 {
				time.AfterFunc(opts.Hold, func() { complete(j.name) })
			}
		}
	}
	_, _ = f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }})
	f.Start(watchCtx.Done())
	f.WaitForCacheSync(watchCtx.Done())

	start := time.Now()
	profiled := make(chan error, 1)
	apiProfiled := make(chan error, 1)
	traced := make(chan error, 1)
	if opts.ProfileDir != "" {
		go func() { profiled <- scr.ControllerProfile(ctx, "profile", opts.ProfileFor, opts.ProfileDir) }()
		go func() { apiProfiled <- scr.APIServerProfile(ctx, opts.ProfileFor, opts.ProfileDir) }()
	} else {
		profiled <- nil
		apiProfiled <- nil
	}
	if opts.ProfileDir != "" && opts.TraceFor > 0 {
		go func() { traced <- scr.ControllerProfile(ctx, "trace", opts.TraceFor, opts.ProfileDir) }()
	} else {
		traced <- nil
	}
	err = parallel(ctx, len(jobs), opts.Creators, func(ctx context.Context, i int) error {
		j := jobs[i]
		if opts.Spread > 0 {
			select {
			case <-time.After(time.Until(start.Add(opts.Spread * time.Duration(i) / time.Duration(len(jobs))))):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		j.created = time.Now()
		mu.Unlock()
		if _, err := env.Client.BatchV1().Jobs(Namespace).Create(ctx, newJob(j.name, j.shape, gputopo, tmpls[j.shape.GPUs]), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Job %s: %w", j.name, err)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.CreateSeconds = time.Since(start).Seconds()
	env.Progressf("created %d Jobs in %.1fs", len(jobs), res.CreateSeconds)
	mu.Lock()
	if lastDone.Before(start) {
		lastDone = time.Now() // Settle counts from the last create, not from before the first
	}
	mu.Unlock()
	lastReport := time.Now()
	_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		done := 0
		for _, j := range jobs {
			if !j.done.IsZero() {
				done++
			}
		}
		if time.Since(lastReport) > 30*time.Second {
			env.Progressf("%d/%d Jobs bound", done, len(jobs))
			lastReport = time.Now()
		}
		return done == len(jobs) || time.Since(lastDone) > opts.Settle, nil
	})
	end := time.Now()
	if err := <-profiled; err != nil {
		return res, err
	}
	if err := <-traced; err != nil {
		return res, err
	}
	if opts.ProfileDir != "" && opts.TraceFor > 0 {
		file := filepath.Join(opts.ProfileDir, "controller-trace.pprof")
		open := func() (io.ReadCloser, error) { return os.Open(file) }
		if res.Planner, res.SlowPlanner, err = ReadTraceRegions(open, "planner", PlanGoal/2); err != nil {
			return res, fmt.Errorf("%s: %w", file, err)
		}
	}
	if err := <-apiProfiled; err != nil {
		return res, err
	}
	if opts.ProfileDir != "" {
		for _, name := range []string{"heap", "mutex", "block"} {
			if err := scr.ControllerProfile(ctx, name, 0, opts.ProfileDir); err != nil {
				return res, err
			}
		}
		env.Progressf("controller profiles in %s", opts.ProfileDir)
	}

	mu.Lock()
	summarizeJobs(&res, jobs, start)
	err = completeErr
	mu.Unlock()
	if err != nil {
		return res, err
	}
	procs := ControlPlane
	if gputopo {
		procs = append(slices.Clone(ControlPlane), "controller")
	}
	if res.Memory = Memory(env.Cluster.Dir(), procs...); len(res.Memory) == 0 {
		return res, fmt.Errorf("read the memory of the cluster's processes: none found in %s/run", env.Cluster.Dir())
	}
	apiAfter, err := scr.APIServer(ctx)
	if err != nil {
		return res, err
	}
	res.Writes = writeDelta(apiBefore, apiAfter)
	if gputopo {
		if err := controllerFigures(ctx, env, scr, &res, ctlBefore, cpuBefore); err != nil {
			return res, err
		}
	}
	if env.auditLog != "" {
		if res.WritesByClient, res.Stages, err = ReadAudit(env.auditLog, start, end); err != nil {
			return res, err
		}
	}
	return res, nil
}

// controllerFigures adds the gputopo controller's CPU, histograms and
// decisions since before to res.
func controllerFigures(ctx context.Context, env *Env, scr *Scraper, res *ControllerResult, before Metrics, cpuBefore ProcStat) error {
	cpuAfter, err := ClusterProc(env.Cluster.Dir(), "controller")
	if err != nil {
		return err
	}
	if cpuAfter.PID != cpuBefore.PID {
		return fmt.Errorf("the controller restarted during the run (pid %d, then %d): see %s", cpuBefore.PID, cpuAfter.PID, env.Cluster.LogPath("controller"))
	}
	res.ControllerCPU = cpuAfter.CPUSeconds - cpuBefore.CPUSeconds
	after, err := scr.Controller(ctx)
	if err != nil {
		return err
	}
	res.Histograms = histDelta(before, after, "gputopo_controller_")
	res.Decisions = map[string]float64{}
	b := before.SumBy("gputopo_controller_decisions_total", nil, "outcome")
	for k, v := range after.SumBy("gputopo_controller_decisions_total", nil, "outcome") {
		res.Decisions[k] = v - b[k]
	}
	return nil
}

// pathTemplates returns the claim template of each GPU count the Job
// shapes use on path: the demo's on PathGputopo, count-only copies of the
// demo's one-GPU claim on PathCountOnly, none on PathNoClaims.
func pathTemplates(path string) (map[int]*resourcev1.ResourceClaimTemplate, error) {
	out := map[int]*resourcev1.ResourceClaimTemplate{}
	switch path {
	case PathGputopo:
		for gpus, name := range ShapeTemplates {
			t, err := specs.ClaimTemplate(name)
			if err != nil {
				return nil, err
			}
			out[gpus] = t
		}
	case PathCountOnly:
		base, err := specs.ClaimTemplate(countTemplate)
		if err != nil {
			return nil, err
		}
		for gpus := range ShapeTemplates {
			if out[gpus], err = withCount(base, gpus); err != nil {
				return nil, err
			}
		}
	case PathNoClaims:
	default:
		return nil, fmt.Errorf("path %q: use %s", path, strings.Join(BurstPaths, ", "))
	}
	return out, nil
}

// completeJob deletes a Job and its pods, as if it had run to completion:
// the pods go at once (no kubelet would confirm a graceful deletion on
// the fake nodes), and their claims with them.
func completeJob(ctx context.Context, env *Env, name string) error {
	if err := env.Client.BatchV1().Jobs(Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		return fmt.Errorf("delete completed Job %s: %w", name, err)
	}
	err := env.Client.CoreV1().Pods(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
	if err != nil {
		return fmt.Errorf("delete the pods of completed Job %s: %w", name, err)
	}
	return nil
}

func summarizeJobs(res *ControllerResult, jobs []*jobInfo, start time.Time) {
	res.Unbound = map[string]int{}
	res.WaitMaxByShape = map[string]float64{}
	var waits []float64
	var last time.Time
	for i, j := range jobs {
		res.PodsBound += len(j.bound)
		if j.done.IsZero() {
			res.Unbound[j.shape.String()]++
			continue
		}
		res.JobsBound++
		w := j.done.Sub(j.created).Seconds()
		waits = append(waits, w)
		if w > res.WaitMax {
			res.WaitMax, res.WaitMaxJob = w, j.name
		}
		res.WaitMaxByShape[j.shape.String()] = max(res.WaitMaxByShape[j.shape.String()], w)
		if j.done.After(last) {
			last = j.done
		}
		overtaken := 0
		var firstLater, firstOnItsNodes time.Time
		for _, later := range jobs[i+1:] {
			if !later.done.IsZero() && later.done.Before(j.done) && later.created.After(j.created) {
				overtaken++
				if firstLater.IsZero() || later.done.Before(firstLater) {
					firstLater = later.done
				}
			}
			if !later.created.After(j.created) {
				continue
			}
			for node, at := range later.nodes {
				if _, mine := j.nodes[node]; mine && at.Before(j.done) && at.After(j.created) &&
					(firstOnItsNodes.IsZero() || at.Before(firstOnItsNodes)) {
					firstOnItsNodes = at
				}
			}
		}
		if !firstOnItsNodes.IsZero() {
			if behind := j.done.Sub(firstOnItsNodes).Seconds(); behind > res.MaxBehindOnItsNodes {
				res.MaxBehindOnItsNodes, res.MaxBehindOnItsNodesJob = behind, j.name
			}
		}
		if !firstLater.IsZero() {
			if behind := j.done.Sub(firstLater).Seconds(); behind > res.MaxBehind {
				res.MaxBehind, res.MaxBehindJob = behind, j.name
			}
		}
		if overtaken > res.MaxOvertaken {
			res.MaxOvertaken, res.MaxOvertakenJob = overtaken, j.name
		}
	}
	if len(waits) > 0 {
		res.AllBoundSeconds = last.Sub(start).Seconds()
		res.WaitP50, res.WaitP99 = percentile(waits, 0.5), percentile(waits, 0.99)
	}
}

// newJob is an Indexed Job of the shape's pods, each with one claim from
// tmpl (none when tmpl is nil), handed to the gputopo controller when
// gputopo is set.
func newJob(name string, s Shape, gputopo bool, tmpl *resourcev1.ResourceClaimTemplate) *batchv1.Job {
	pods := int32(s.Pods)
	var ann map[string]string
	if gputopo {
		ann = map[string]string{placement.AnnotationPlacement: string(placement.PlacementAuto)}
	}
	template := ""
	if tmpl != nil {
		template = tmpl.Name
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To(pods),
			Completions:    ptr.To(pods),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			BackoffLimit:   ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      map[string]string{LabelWorkload: "jobs"},
					Annotations: ann,
				},
				Spec: podSpec(template),
			},
		},
	}
}

// mutatingVerbs are the apiserver_request_total verbs that write.
var mutatingVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

func writeDelta(before, after Metrics) map[string]float64 {
	const name = "apiserver_request_total"
	out := map[string]float64{}
	b := before.SumBy(name, nil, "verb", "resource", "subresource")
	for k, v := range after.SumBy(name, nil, "verb", "resource", "subresource") {
		verb, rest, _ := strings.Cut(k, "/")
		if !mutatingVerbs[verb] {
			continue
		}
		if d := v - b[k]; d > 0 {
			out[verb+" "+strings.TrimSuffix(rest, "/")] = d
		}
	}
	return out
}

// histDelta summarizes every histogram series with the prefix observed
// between two scrapes.
func histDelta(before, after Metrics, prefix string) []HistSummary {
	var out []HistSummary
	for _, name := range after.HistogramNames(prefix) {
		b, a := before.Series(name), after.Series(name)
		keys := make([]string, 0, len(a))
		for k := range a {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			d := a[k].Sub(b[k])
			if d.Count == 0 {
				continue
			}
			over, ok := d.Above(PlanGoal.Seconds())
			if !ok {
				over = -1
			}
			out = append(out, HistSummary{Name: name, Labels: k, Count: d.Count, Mean: d.Mean(),
				P50: d.Quantile(0.5), P90: d.Quantile(0.9), P99: d.Quantile(0.99), OverGoal: over})
		}
	}
	return out
}
