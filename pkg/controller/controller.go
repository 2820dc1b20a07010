// Package controller runs gputopo's placement loop: it groups opted-in pods
// (a Job, or pods sharing gputopo.dev/group), asks the planner where the
// whole group fits as the scheduler's own DRA allocator judges it, pins
// every pod to its node while the pods are still gated, and only then
// removes the gates, so the built-in kube-scheduler places the group all
// at once or not at all.
package controller

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Config configures the controller.
type Config struct {
	Client  kubernetes.Interface
	Network topology.LabelMapping
	// LeafOrder optionally fixes the order (adjacency) of leaves under each
	// spine; by default leaves are ordered by name, naturally.
	LeafOrder map[string][]string
	Metrics   *Metrics
	// RetryInterval re-plans groups that did not fit even when nothing
	// visible changed.
	RetryInterval time.Duration
}

// Controller is the placement loop.
type Controller struct {
	cfg      Config
	factory  informers.SharedInformerFactory
	pods     corelisters.PodLister
	podIdx   cache.Indexer
	nodes    corelisters.NodeLister
	jobs     batchlisters.JobLister
	slices   resourcelisters.ResourceSliceLister
	claims   resourcelisters.ResourceClaimLister
	tmpls    resourcelisters.ResourceClaimTemplateLister
	classes  resourcelisters.DeviceClassLister
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	bcast    record.EventBroadcaster
	planner  *planner.Planner
	synced   []cache.InformerSynced

	mu sync.Mutex
	// network is the label mapping in force; it starts as Config.Network.
	network topology.LabelMapping
	// cluster is the static tree, rebuilt when nodes, slices or the label
	// mapping change.
	cluster      *planner.Cluster
	clusterDirty bool
	// inflight holds reservations made by this process whose pod
	// annotations the informer has not shown yet.
	inflight map[string]planner.Reservation
	pending  map[string]bool
}

// New wires the informers. Call Run to start.
func New(cfg Config) (*Controller, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 30 * time.Second
	}
	f := informers.NewSharedInformerFactory(cfg.Client, 10*time.Minute)
	podInf := f.Core().V1().Pods().Informer()
	if err := podInf.AddIndexers(cache.Indexers{groupIndex: indexByGroup}); err != nil {
		return nil, fmt.Errorf("add pod group index: %w", err)
	}
	bcast := record.NewBroadcaster()
	c := &Controller{
		cfg:     cfg,
		factory: f,
		pods:    f.Core().V1().Pods().Lister(),
		podIdx:  podInf.GetIndexer(),
		nodes:   f.Core().V1().Nodes().Lister(),
		jobs:    f.Batch().V1().Jobs().Lister(),
		slices:  f.Resource().V1().ResourceSlices().Lister(),
		claims:  f.Resource().V1().ResourceClaims().Lister(),
		tmpls:   f.Resource().V1().ResourceClaimTemplates().Lister(),
		classes: f.Resource().V1().DeviceClasses().Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gputopo-groups"}),
		bcast:        bcast,
		recorder:     bcast.NewRecorder(scheme.Scheme, v1.EventSource{Component: "gputopo-controller"}),
		network:      cfg.Network,
		clusterDirty: true,
		inflight:     map[string]planner.Reservation{},
		pending:      map[string]bool{},
	}
	c.planner = planner.New(devicefit.NewEvaluator(classLister{c.classes}))

	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{podInf, cache.ResourceEventHandlerFuncs{AddFunc: c.onPod, UpdateFunc: func(_, o any) { c.onPod(o) }, DeleteFunc: c.onPod}},
		{f.Core().V1().Nodes().Informer(), c.topologyChanged(nodeMoved)},
		{f.Resource().V1().ResourceSlices().Informer(), c.topologyChanged(nil)},
		{f.Resource().V1().ResourceClaims().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onClaim, UpdateFunc: func(_, o any) { c.onClaim(o) }, DeleteFunc: c.onClaim}},
		{f.Batch().V1().Jobs().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onJob, UpdateFunc: func(_, o any) { c.onJob(o) }}},
		{f.Resource().V1().ResourceClaimTemplates().Informer(), cache.ResourceEventHandlerFuncs{}},
		{f.Resource().V1().DeviceClasses().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.requeuePending() }, UpdateFunc: func(_, _ any) { c.requeuePending() }}},
	}
	for _, h := range handlers {
		reg, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

type classLister struct {
	l resourcelisters.DeviceClassLister
}

func (c classLister) List() ([]*resourceapi.DeviceClass, error) { return c.l.List(everything) }
func (c classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	return c.l.Get(name)
}

func (c *Controller) onPod(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if key, ok := groupKey(pod); ok {
		c.queue.Add(key)
	}
}

// onClaim re-syncs the group of the pod that owns a claim: allocation ends
// a reservation, deallocation frees devices for pending groups.
func (c *Controller) onClaim(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	for _, ref := range claim.OwnerReferences {
		if ref.Kind == "Pod" {
			if pod, err := c.pods.Pods(claim.Namespace).Get(ref.Name); err == nil {
				c.onPod(pod)
			}
		}
	}
	if claim.Status.Allocation == nil {
		c.requeuePending()
	}
}

func (c *Controller) onJob(obj any) {
	if job, ok := obj.(*batchv1.Job); ok {
		c.queue.Add(job.Namespace + "/job/" + job.Name)
	}
}

// topologyChanged marks the static tree stale. relevant, when set, skips
// updates that cannot change the tree, such as node status heartbeats, so
// a large cluster is not rebuilt for every plan.
func (c *Controller) topologyChanged(relevant func(old, cur any) bool) cache.ResourceEventHandler {
	mark := func(any) {
		c.mu.Lock()
		c.clusterDirty = true
		c.mu.Unlock()
		c.requeuePending()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: mark,
		UpdateFunc: func(old, cur any) {
			if relevant == nil || relevant(old, cur) {
				mark(cur)
			}
		},
		DeleteFunc: mark,
	}
}

// nodeMoved reports node updates the planner sees: labels (the network
// tree) and whether the node takes new pods.
func nodeMoved(old, cur any) bool {
	o, ok1 := old.(*v1.Node)
	n, ok2 := cur.(*v1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return o.Spec.Unschedulable != n.Spec.Unschedulable || !maps.Equal(o.Labels, n.Labels)
}

// SetLabelMapping rebuilds the tree with a new label mapping, which can
// move any node, and retries the groups that wait.
func (c *Controller) SetLabelMapping(m topology.LabelMapping) {
	c.mu.Lock()
	c.network, c.clusterDirty = m, true
	c.mu.Unlock()
	c.requeuePending()
}

// requeuePending retries every group still waiting for room.
func (c *Controller) requeuePending() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.pending {
		c.queue.AddRateLimited(key)
	}
}

// Run processes groups until ctx is done. One worker plans at a time, so
// two plans never race for the same devices.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cfg.Client.CoreV1().Events("")})
	defer c.bcast.Shutdown()
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced...) {
		return fmt.Errorf("caches did not sync: %w", context.Cause(ctx))
	}
	logger.Info("gputopo controller running")
	go wait.UntilWithContext(ctx, c.worker, time.Second)
	go wait.UntilWithContext(ctx, func(context.Context) { c.requeuePending() }, c.cfg.RetryInterval)
	go wait.UntilWithContext(ctx, c.updateUsage, 15*time.Second)
	<-ctx.Done()
	return nil
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("group", key)), key); err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Syncing pod group failed", "group", key)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// snapshotCluster returns the static tree, rebuilding it when nodes or
// slices changed since the last plan.
func (c *Controller) snapshotCluster() (*planner.Cluster, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.clusterDirty && c.cluster != nil {
		return c.cluster, nil
	}
	nodes, err := c.nodes.List(everything)
	if err != nil {
		return nil, err
	}
	all, err := c.slices.List(everything)
	if err != nil {
		return nil, err
	}
	byNode := map[string][]*resourceapi.ResourceSlice{}
	for _, s := range all {
		if s.Spec.NodeName != nil {
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s)
		}
	}
	infos := make([]planner.NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		infos = append(infos, planner.NodeInfoFor(n, byNode[n.Name], c.network))
	}
	cl, err := planner.NewCluster(infos, c.cfg.LeafOrder)
	if err != nil {
		return nil, fmt.Errorf("build topology tree: %w", err)
	}
	c.cluster, c.clusterDirty = cl, false
	return cl, nil
}

// allocated lists every device held by an allocated claim.
func (c *Controller) allocated() (devicefit.Allocated, error) {
	claims, err := c.claims.List(everything)
	if err != nil {
		return nil, err
	}
	out := devicefit.Allocated{}
	for _, cl := range claims {
		if cl.Status.Allocation != nil {
			devicefit.AddResults(out, *cl.Status.Allocation)
		}
	}
	return out, nil
}

// updateUsage refreshes the utilization and fragmentation gauges.
func (c *Controller) updateUsage(ctx context.Context) {
	cl, err := c.snapshotCluster()
	if err != nil {
		return
	}
	alloc, err := c.allocated()
	if err != nil {
		return
	}
	res, err := c.reservations(ctx, "")
	if err != nil {
		return
	}
	u := planner.Measure(planner.NewSnapshot(cl, alloc), res)
	c.cfg.Metrics.LeafUtilization.Reset()
	for _, l := range u.Leaves {
		c.cfg.Metrics.LeafUtilization.WithLabelValues(l.Spine, l.Leaf).Set(l.Utilization)
	}
	c.cfg.Metrics.Fragmentation.Set(u.Fragmentation)
	c.cfg.Metrics.LeafFragment.Set(u.LeafFragmentation)
	c.mu.Lock()
	c.cfg.Metrics.PendingGroups.Set(float64(len(c.pending)))
	c.mu.Unlock()
}
