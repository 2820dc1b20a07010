// Package controller runs gputopo's placement loop: it groups opted-in pods
// (a Job, a JobSet, a LeaderWorkerSet replica group, or pods sharing
// gputopo.dev/group), asks the planner where the whole group fits as the
// scheduler's own DRA allocator judges it, writes that plan into the pods'
// ResourceClaims as their allocation while the pods are still gated, and
// only then removes the gates. The built-in kube-scheduler places each pod
// where its claims are allocated and counts those devices as taken for
// every other pod, so the plan is a reservation nobody else can take.
// Pods that do not bind in time, or whose node fails, have their claims
// taken back and are planned again.
package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1beta1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"

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
	// visible changed; retries of one group back off up to it.
	RetryInterval time.Duration
	// BindTimeout is how long a pod whose gate opened may take to bind
	// before its claims are taken back and it is planned again.
	BindTimeout time.Duration
	// SettleDelay keeps the gates closed this long after the claims were
	// written and seen (0: they open at once), so that an allocation the
	// scheduler had in flight lands while the group can still be planned
	// again around it. It is not what keeps a device from two pods: a
	// clash after the gates opened is resolved too, the pod that has not
	// started giving way (decide.go, clashes), but giving way after the
	// gate opened means deleting the pod, which its Job counts as a
	// failure.
	SettleDelay time.Duration
	// ReserveAfter is how long the oldest group that does not fit waits
	// before it reserves the domain closest to fitting it, which groups
	// created after it may then not use (reserve.go). Default:
	// RetryInterval.
	ReserveAfter time.Duration
	// ReservationTimeout ends a reservation whose group is still not
	// placed; the group may not reserve again for as long. Default: 10 ×
	// ReserveAfter.
	ReservationTimeout time.Duration
	// ClaimNodeSelectors keeps, per namespace, the node selectors that
	// claims pinning a leaf or spine in CEL imply, for the
	// gputopo-claim-node-selector admission policy (nodeselectors.go).
	ClaimNodeSelectors bool
	// AllocationMode says who allocates the devices of a placed group
	// (native.go); empty means auto.
	AllocationMode AllocationMode
	// WritingGroups is how many groups' writes may be in flight while the
	// worker plans the next groups (writebehind.go); 0 makes each group's
	// writes in the worker, before the next sync.
	WritingGroups int
}

// Controller is the placement loop.
type Controller struct {
	cfg     Config
	factory informers.SharedInformerFactory
	pods    corelisters.PodLister
	podIdx  cache.Indexer
	nodes   corelisters.NodeLister
	// namespaces are read for their labels, which namespace selectors in
	// pod affinity terms match.
	namespaces corelisters.NamespaceLister
	jobs       batchlisters.JobLister
	// volumes reads the PersistentVolumeClaims, PersistentVolumes and
	// StorageClasses that hold pods to nodes (volumes.go).
	volumes volumeView
	// podGroups reads kube-scheduler's PodGroups; nil where the API
	// server does not serve them.
	podGroups schedulinglisters.PodGroupLister
	// sliceIdx holds every ResourceSlice as kube-scheduler sees it: with
	// the DeviceTaintRules that select its devices applied, kept by the
	// resourceslice tracker (startInformers) and indexed by node.
	sliceIdx cache.Indexer
	// sliceTracker is the tracker; nil until startInformers.
	sliceTracker *tracker.Tracker
	// fences keeps DeviceTaintRules on the devices kube-scheduler lost
	// count of (fence.go); nil where DeviceTaintRules are not served.
	fences  *fencer
	claims  resourcelisters.ResourceClaimLister
	tmpls   resourcelisters.ResourceClaimTemplateLister
	classes resourcelisters.DeviceClassLister
	// extClasses maps DRA extended resource names to their DeviceClass,
	// as kube-scheduler maps them (extended.go).
	extClasses *extendedresourcecache.ExtendedResourceCache
	queue      workqueue.TypedRateLimitingInterface[string]
	// releases holds placed groups whose gates are due to open; the
	// worker serves it before each key of queue, so opening gates never
	// waits behind a backlog of groups still to be planned.
	releases workqueue.TypedDelayingInterface[string]
	recorder record.EventRecorder
	bcast    record.EventBroadcaster
	planner  *planner.Planner
	synced   []cache.InformerSynced
	// ready is set once the worker has synced every group the caches held
	// at start (Ready).
	ready atomic.Bool

	index *claimIndex

	mu sync.Mutex
	// network is the label mapping in force; it starts as Config.Network.
	network topology.LabelMapping
	// cluster is the static tree, patched or rebuilt from topo when
	// nodes, slices or the label mapping change.
	cluster *planner.Cluster
	topo    topoState
	pending map[string]waiting       // groups that did not fit
	settle  map[string]time.Time     // groups whose gates stay closed until then
	opened  map[types.UID]time.Time  // when this process opened a pod's gate
	noted   map[types.UID]bool       // pods whose lost node was reported
	planned map[types.UID]plannedPod // gated pods with DRA extended resources, where they were planned
	// inflight holds the devices of the plans of groups whose devices
	// kube-scheduler allocates (steer), from the plan until their pods are
	// bound, for every other group's plan: nothing else shows them before
	// the scheduler's cycle, and two groups would be sent to the same
	// room. inflightAt is when each was planned.
	inflight   *planner.Reservations
	inflightAt map[string]time.Time
	usage      planner.NodeUsage // what the pods on each node request
	// tracker keeps the plans' snapshot up to date from the claim index
	// and usage; usageDirty names the nodes whose usage changed since.
	tracker    *planner.Tracker
	usageDirty map[string]bool
	// reserved is the domain the oldest waiting group holds; unreservable
	// lists the groups that no domain could ever hold.
	reserved     *reservation
	unreservable map[string]bool
	// expired holds when each group's last reservation expired;
	// expiredEvents are expirations still to be reported.
	expired       map[string]time.Time
	expiredEvents []*reservation

	// pins keeps the claims' node selectors (nodeselectors.go); nil when
	// Config.ClaimNodeSelectors is off.
	pins *pinSync

	// writeSlots holds a token per group whose writes are in flight beside
	// the worker, writing what the controller knows of them (under mu),
	// writers the goroutines making them (writebehind.go). writeSlots is
	// nil when Config.WritingGroups is 0.
	writeSlots chan struct{}
	// statusSlots are the slots of the writes of what waiting groups wait
	// for (statusBehind); nil with writeSlots.
	statusSlots chan struct{}
	writing     map[string]*groupWrites
	writers     sync.WaitGroup
	// lagging names, per claim, the groups that read it older than the
	// claim index holds it (the controller's own write, not in the
	// informer yet): the claim's next event syncs them (under mu).
	lagging map[types.UID][]string
}

// New wires the informers. Call Run to start.
func New(cfg Config) (*Controller, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 30 * time.Second
	}
	if cfg.BindTimeout == 0 {
		cfg.BindTimeout = 60 * time.Second
	}
	if cfg.ReserveAfter == 0 {
		cfg.ReserveAfter = cfg.RetryInterval
	}
	if cfg.ReservationTimeout == 0 {
		cfg.ReservationTimeout = 10 * cfg.ReserveAfter
	}
	if cfg.AllocationMode == "" {
		cfg.AllocationMode = AllocationAuto
	}
	if !slices.Contains(AllocationModes, cfg.AllocationMode) {
		return nil, fmt.Errorf("unknown allocation mode %q: use auto, controller or scheduler", cfg.AllocationMode)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 10*time.Minute, informers.WithTransform(cacheTransform(newInterner(internerLimit))))
	podInf := f.Core().V1().Pods().Informer()
	if err := podInf.AddIndexers(cache.Indexers{groupIndex: indexByGroup, nodeIndex: indexByNode, podGroupIndex: indexByPodGroup, antiAffinityIndex: indexByAntiAffinity, hostPortIndex: indexByHostPorts, pvcIndex: indexByPVC, pvcUserIndex: indexByPVCUser}); err != nil {
		return nil, fmt.Errorf("add pod group index: %w", err)
	}
	pvInf := f.Core().V1().PersistentVolumes().Informer()
	if err := pvInf.AddIndexers(cache.Indexers{pvClassIndex: indexPVByClass}); err != nil {
		return nil, fmt.Errorf("add volume class index: %w", err)
	}
	bcast := record.NewBroadcaster()
	c := &Controller{
		cfg:        cfg,
		factory:    f,
		pods:       f.Core().V1().Pods().Lister(),
		podIdx:     podInf.GetIndexer(),
		nodes:      f.Core().V1().Nodes().Lister(),
		namespaces: f.Core().V1().Namespaces().Lister(),
		jobs:       f.Batch().V1().Jobs().Lister(),
		volumes: volumeView{
			pvcs: f.Core().V1().PersistentVolumeClaims().Lister(), pvs: f.Core().V1().PersistentVolumes().Lister(),
			pvIdx: pvInf.GetIndexer(), classes: f.Storage().V1().StorageClasses().Lister(),
			drivers: f.Storage().V1().CSIDrivers().Lister(), capacities: f.Storage().V1().CSIStorageCapacities().Lister(),
			users: podInf.GetIndexer(),
		},
		sliceIdx: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{sliceNodeIndex: indexSliceByNode}),
		claims:   f.Resource().V1().ResourceClaims().Lister(),
		tmpls:    f.Resource().V1().ResourceClaimTemplates().Lister(),
		classes:  f.Resource().V1().DeviceClasses().Lister(),
		// Each group backs off on its own; there is no shared bucket that
		// many waiting groups could drain for each other.
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, cfg.RetryInterval),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gputopo-groups"}),
		releases: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: "gputopo-releases"}),
		index:    newClaimIndex(),
		bcast:    bcast,
		recorder: bcast.NewRecorder(scheme.Scheme, v1.EventSource{Component: "gputopo-controller"}),
		network:  cfg.Network,
		topo:     newTopoState(),
		pending:  map[string]waiting{},
		settle:   map[string]time.Time{},
		opened:   map[types.UID]time.Time{},
		noted:    map[types.UID]bool{},
		planned:  map[types.UID]plannedPod{},
		inflight: planner.NewReservations(), inflightAt: map[string]time.Time{},
		usage: planner.NodeUsage{},

		usageDirty:   map[string]bool{},
		unreservable: map[string]bool{},
		expired:      map[string]time.Time{},
		writing:      map[string]*groupWrites{},
		lagging:      map[types.UID][]string{},
	}
	if cfg.WritingGroups > 0 {
		c.writeSlots = make(chan struct{}, cfg.WritingGroups)
		c.statusSlots = make(chan struct{}, cfg.WritingGroups)
	}
	c.planner = planner.New(devicefit.NewEvaluator(classLister{c.classes}))
	c.extClasses = extendedresourcecache.NewExtendedResourceCache(klog.Background(),
		cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.requeuePending() }, UpdateFunc: func(_, _ any) { c.requeuePending() }})

	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{podInf, cache.ResourceEventHandlerFuncs{AddFunc: c.onPodAdd, UpdateFunc: c.onPodUpdate, DeleteFunc: c.onPodDelete}},
		{f.Core().V1().Nodes().Informer(), c.nodeHandler()},
		// A namespace relabelled may tie a waiting group to pods in it,
		// or untie it.
		{f.Core().V1().Namespaces().Informer(), cache.ResourceEventHandlerFuncs{UpdateFunc: c.onNamespaceUpdate}},
		// Claims bound, volumes created, classes changed and storage
		// capacity published decide where the pods that use them may go
		// (volumes.go).
		{f.Core().V1().PersistentVolumeClaims().Informer(), c.volumeHandler()},
		{pvInf, c.volumeHandler()},
		{f.Storage().V1().StorageClasses().Informer(), c.volumeHandler()},
		{f.Storage().V1().CSIDrivers().Informer(), c.volumeHandler()},
		{f.Storage().V1().CSIStorageCapacities().Informer(), c.volumeHandler()},
		{f.Resource().V1().ResourceClaims().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onClaimAdd, UpdateFunc: c.onClaimUpdate, DeleteFunc: c.onClaimDelete}},
		{f.Batch().V1().Jobs().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onJob, UpdateFunc: func(_, o any) { c.onJob(o) }, DeleteFunc: c.onJob}},
		{f.Resource().V1().ResourceClaimTemplates().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.requeuePending() }}},
		// Class events requeue waiting groups once the cache has mapped
		// the class's extended resource.
		{f.Resource().V1().DeviceClasses().Informer(), c.extClasses},
	}
	if servesPodGroups(cfg.Client.Discovery()) {
		inf := f.Scheduling().V1beta1().PodGroups()
		c.podGroups = inf.Lister()
		handlers = append(handlers, struct {
			inf cache.SharedIndexInformer
			h   cache.ResourceEventHandler
		}{inf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onPodGroup, UpdateFunc: func(_, o any) { c.onPodGroup(o) }, DeleteFunc: c.onPodGroup}})
	}
	klog.Background().Info("Allocation mode", "mode", cfg.AllocationMode, "podGroupsServed", c.podGroups != nil)
	for _, h := range handlers {
		reg, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
		c.synced = append(c.synced, reg.HasSynced)
	}
	if cfg.ClaimNodeSelectors {
		pins, err := newPinSync(cfg.Client, f, cfg.Network)
		if err != nil {
			return nil, fmt.Errorf("claims' node selectors: %w", err)
		}
		c.pins = pins
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

func podOf(obj any) *v1.Pod {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, _ := obj.(*v1.Pod)
	return p
}

// usageNode is where a pod takes cpu, memory and a pod slot: its node, or
// the node its claims were allocated on once its gate opened.
func usageNode(p *v1.Pod) string {
	if p.Spec.NodeName != "" || hasGate(p) {
		return p.Spec.NodeName
	}
	return p.Annotations[placement.AnnotationNode]
}

func (c *Controller) countPod(old, cur *v1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old != nil {
		n := usageNode(old)
		c.usage.Remove(n, old)
		c.usageDirty[n] = true
	}
	if cur != nil {
		n := usageNode(cur)
		c.usage.Add(n, cur)
		c.usageDirty[n] = true
	}
}

func (c *Controller) onPodAdd(obj any) {
	if pod := podOf(obj); pod != nil {
		c.countPod(nil, pod)
		c.onPod(pod)
	}
}

func (c *Controller) onPod(obj any) {
	if pod := podOf(obj); pod != nil {
		if key, ok := groupKey(pod); ok {
			c.queue.Add(key)
		}
	}
}

// onPodUpdate reacts to what can change a plan: gates, binding, phase,
// deletion, claims created for the pod. Status heartbeats are skipped.
func (c *Controller) onPodUpdate(old, cur any) {
	o, n := podOf(old), podOf(cur)
	if o == nil || n == nil {
		return
	}
	c.countPod(o, n)
	if o.Status.Phase != n.Status.Phase && !active(n) {
		c.requeuePending() // a finished pod frees cpu and memory
	}
	if was, _ := indexByPVCUser(o); len(was) > 0 {
		if is, _ := indexByPVCUser(n); len(is) == 0 {
			c.onClaimUser(o) // it stopped using its claims
		}
	}
	oldKey, wasIn := groupKey(o)
	newKey, isIn := groupKey(n)
	if wasIn && (!isIn || oldKey != newKey) {
		// The pod left its group: orphaned by its Job, its group
		// annotation edited, or opted out. The old group sees it gone.
		c.queue.Add(oldKey)
	}
	if !isIn {
		return
	}
	if oldKey != newKey || !placementAnnotationsEqual(o, n) {
		c.queue.Add(newKey) // a fixed annotation is retried at once
		return
	}
	if len(o.Spec.SchedulingGates) != len(n.Spec.SchedulingGates) || o.Spec.NodeName != n.Spec.NodeName ||
		o.Status.Phase != n.Status.Phase || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
		!resourceclaim.PodStatusEqual(o.Status.ResourceClaimStatuses, n.Status.ResourceClaimStatuses) ||
		!podScheduledEqual(o, n) {
		c.onPod(n)
	}
}

// placementAnnotationsEqual reports whether the annotations a user sets
// to ask for placement are the same on both pods.
func placementAnnotationsEqual(a, b *v1.Pod) bool {
	for _, k := range placement.UserAnnotations {
		if a.Annotations[k] != b.Annotations[k] {
			return false
		}
	}
	return true
}

func podScheduledEqual(a, b *v1.Pod) bool {
	get := func(p *v1.Pod) v1.ConditionStatus {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled {
				return c.Status
			}
		}
		return ""
	}
	return get(a) == get(b)
}

func (c *Controller) onPodDelete(obj any) {
	pod := podOf(obj)
	if pod == nil {
		return
	}
	c.mu.Lock()
	delete(c.opened, pod.UID)
	delete(c.noted, pod.UID)
	delete(c.planned, pod.UID)
	c.mu.Unlock()
	c.countPod(pod, nil)
	c.onPod(pod)
	c.onClaimUser(pod)
	if !finished(pod) && usageNode(pod) != "" {
		// A pod that leaves its node frees cpu and memory, and what its
		// pod anti-affinity kept other pods out of.
		c.requeuePending()
	}
}

func claimOf(obj any) *resourceapi.ResourceClaim {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	cl, _ := obj.(*resourceapi.ResourceClaim)
	return cl
}

// onClaim indexes the claim's devices and re-syncs the group of the pod
// that owns it and the group that allocated it. A claim that now shares a
// device with another claim re-syncs the groups of both, which resolve the
// clash. A freed claim lets waiting groups try again.
func (c *Controller) onClaim(obj any) {
	claim := claimOf(obj)
	if claim == nil {
		return
	}
	for _, uid := range c.index.update(claim) {
		c.syncClaimGroups(c.index.key(uid))
	}
	c.syncClaimGroups(claim.Namespace + "/" + claim.Name)
	c.wakeLagging(claim.UID)
}

// lagBehind notes that group key read claim older than the claim index
// holds it, so that the claim's next event syncs the group. It reports
// false when the informer caught up meanwhile (the event may have come
// between the read and the note): the caller syncs the group again then.
func (c *Controller) lagBehind(key string, claim *resourceapi.ResourceClaim) bool {
	c.mu.Lock()
	if !slices.Contains(c.lagging[claim.UID], key) {
		c.lagging[claim.UID] = append(c.lagging[claim.UID], key)
	}
	c.mu.Unlock()
	fresh, err := c.claims.ResourceClaims(claim.Namespace).Get(claim.Name)
	if err != nil || fresh.UID != claim.UID {
		return false
	}
	ahead, _ := c.index.ahead(fresh.UID, fresh.ResourceVersion)
	return ahead
}

// wakeLagging syncs the groups that wait for the claim's event.
func (c *Controller) wakeLagging(uid types.UID) {
	c.mu.Lock()
	keys := c.lagging[uid]
	delete(c.lagging, uid)
	c.mu.Unlock()
	for _, k := range keys {
		c.queue.Add(k)
	}
}

func (c *Controller) onClaimAdd(obj any) {
	if claim := claimOf(obj); claim != nil {
		c.index.observe(nil, claim)
	}
	c.onClaim(obj)
}

func (c *Controller) onClaimUpdate(old, cur any) {
	o, n := claimOf(old), claimOf(cur)
	if o == nil || n == nil {
		return
	}
	c.index.observe(o, n)
	c.onClaim(n)
	if o.Status.Allocation != nil && n.Status.Allocation == nil {
		c.requeuePending()
	}
}

func (c *Controller) onClaimDelete(obj any) {
	claim := claimOf(obj)
	if claim == nil {
		return
	}
	c.index.remove(claim.UID)
	c.index.observe(claim, nil)
	c.syncClaimGroups(claim.Namespace + "/" + claim.Name)
	c.wakeLagging(claim.UID)
	if claim.Status.Allocation != nil {
		c.requeuePending()
	}
}

// syncClaimGroups enqueues the groups that a claim, given as
// namespace/name, matters to: the one that allocated it and the one of
// the pod that owns it.
func (c *Controller) syncClaimGroups(key string) {
	ns, name, ok := strings.Cut(key, "/")
	if !ok {
		return
	}
	claim, err := c.claims.ResourceClaims(ns).Get(name)
	if err != nil {
		return
	}
	if g, ok := claim.Annotations[placement.AnnotationAllocatedBy]; ok {
		c.queue.Add(g)
		c.mu.Lock()
		_, placed := c.settle[g]
		c.mu.Unlock()
		if placed {
			c.releases.Add(g) // its gates may open now
		}
	}
	for _, ref := range claim.OwnerReferences {
		if ref.Kind == "Pod" {
			if pod, err := c.pods.Pods(claim.Namespace).Get(ref.Name); err == nil {
				c.onPod(pod)
			}
		}
	}
}

func (c *Controller) onJob(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	job, ok := obj.(*batchv1.Job)
	if !ok {
		return
	}
	c.queue.Add(job.Namespace + "/" + kindJob + "/" + job.Name)
	if js := job.Labels[labelJobSetName]; js != "" {
		c.queue.Add(job.Namespace + "/" + kindJobSet + "/" + js)
	}
}

// syncGroupsOn re-syncs the groups with pods bound or steered to a node
// that was deleted or changed as the planner sees it (readiness, taints,
// cordon, labels, devices), so their pods are recovered at once rather than
// at the bind timeout.
func (c *Controller) syncGroupsOn(node string) {
	pods, err := c.podIdx.ByIndex(nodeIndex, node)
	if err != nil {
		return
	}
	for _, o := range pods {
		if key, ok := groupKey(o.(*v1.Pod)); ok {
			c.queue.Add(key)
		}
	}
}

// requeuePending retries every group still waiting for room, oldest
// first: the queue hands keys out in the order they were added, so room
// that frees up goes to the group created first, and later groups
// backfill what it leaves. The queue holds a key once, so a burst of
// events costs one plan per group.
func (c *Controller) requeuePending() {
	c.mu.Lock()
	keys := waitOrder(c.pending)
	c.mu.Unlock()
	for _, key := range keys {
		c.queue.Add(key)
	}
}

// Run processes groups until ctx is done. One worker plans at a time, so
// two plans never race for the same devices; the writes of up to
// Config.WritingGroups groups run beside it (writebehind.go).
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	// On the way out: the queue shut down, the worker's last sync ended
	// (so it starts no more writes), then the writes in flight end.
	var worker sync.WaitGroup
	defer c.waitWrites()
	defer worker.Wait()
	defer c.queue.ShutDown()
	defer c.releases.ShutDown()
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cfg.Client.CoreV1().Events("")})
	defer c.bcast.Shutdown()
	if err := c.startInformers(ctx); err != nil {
		return err
	}
	defer c.factory.Shutdown()
	defer c.sliceTracker.Stop()
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced...) {
		return fmt.Errorf("caches did not sync: %w", context.Cause(ctx))
	}
	logger.Info("gputopo controller running")
	if c.fences != nil {
		if err := c.fences.resync(); err != nil {
			return fmt.Errorf("list the DeviceTaintRules that fence devices: %w", err)
		}
		go c.fences.run(ctx)
	}
	// Every group of the synced caches is queued by now (the handlers'
	// registrations have synced): the marker comes out of the queue after
	// each of them has been synced once.
	c.queue.Add(firstPassKey)
	worker.Go(func() { wait.UntilWithContext(ctx, c.worker, time.Second) })
	go wait.UntilWithContext(ctx, func(context.Context) { c.requeuePending() }, c.cfg.RetryInterval)
	go wait.UntilWithContext(ctx, c.updateUsage, 15*time.Second)
	if c.pins != nil {
		go c.pins.run(ctx)
	}
	<-ctx.Done()
	return nil
}

// startInformers starts the resourceslice tracker on the factory's slice
// informer, and the DeviceTaintRule informer where the API server serves
// them, then starts the factory. c.synced covers the tracker too.
func (c *Controller) startInformers(ctx context.Context) error {
	rules, err := servesDeviceTaintRules(c.cfg.Client)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("ResourceSlices are read through the resourceslice tracker", "deviceTaintRules", rules)
	tr, err := tracker.StartTracker(ctx, tracker.Options{
		EnableDeviceTaintRules:   rules,
		EnableConsumableCapacity: devicefit.Features().ConsumableCapacity,
		SliceInformer:            c.factory.Resource().V1().ResourceSlices(),
		TaintInformer:            c.factory.Resource().V1().DeviceTaintRules(),
		KubeClient:               c.cfg.Client,
	})
	if err != nil {
		return fmt.Errorf("start the resourceslice tracker: %w", err)
	}
	c.sliceTracker = tr
	if rules {
		inf := c.factory.Resource().V1().DeviceTaintRules()
		c.fences = newFencer(c.cfg.Client, inf.Lister(), c.index, c.cfg.Metrics.Fences.Inc)
		reg, err := inf.Informer().AddEventHandler(c.fences.handler())
		if err != nil {
			tr.Stop()
			return fmt.Errorf("watch DeviceTaintRules: %w", err)
		}
		c.synced = append(c.synced, reg.HasSynced)
		c.index.gaveBack = c.fences.gaveBack
	} else {
		c.index.gaveBack = func(d structured.DeviceID) {
			if blind, holders := c.index.isBlind(d); blind && holders > 0 {
				klog.FromContext(ctx).Info("Warning: kube-scheduler no longer counts a device as allocated though a claim holds it (two claims held it at once and one gave it back), and the API server serves no DeviceTaintRules to fence it with: it may allocate the device again", "device", d, "holders", c.index.holderKeys(d))
			}
		}
	}
	c.factory.Start(ctx.Done())
	reg, err := tr.AddEventHandler(c.sliceHandler())
	if err != nil {
		tr.Stop()
		return fmt.Errorf("watch ResourceSlices through the tracker: %w", err)
	}
	c.synced = append(c.synced, tr.HasSynced, reg.HasSynced)
	return nil
}

// servesDeviceTaintRules reports whether the API server serves
// DeviceTaintRules in resource.k8s.io/v1, as it does by default from
// Kubernetes 1.37 on. kube-scheduler applies them whenever they are
// served, and so does the controller; where they are not (1.36 by
// default), watching them would never sync, and neither applies any.
// 1.36 with its beta gate DRADeviceTaintRules on serves them in v1beta2
// only: kube-scheduler applies them there, but the controller, which reads
// v1, could not, and would plan pods onto devices the scheduler keeps
// free. That is an error naming the way out, not a controller that
// half-works.
func servesDeviceTaintRules(client kubernetes.Interface) (bool, error) {
	if servesResource(client, resourceapi.SchemeGroupVersion.String(), "devicetaintrules") {
		return true, nil
	}
	if servesResource(client, "resource.k8s.io/v1beta2", "devicetaintrules") {
		return false, errors.New("the API server serves DeviceTaintRules only in resource.k8s.io/v1beta2 (Kubernetes 1.36 with the beta gate DRADeviceTaintRules on), which kube-scheduler applies and gputopo's controller cannot read: turn DRADeviceTaintRules off, or upgrade to Kubernetes 1.37, which serves them in v1")
	}
	return false, nil
}

// servesResource reports whether discovery lists resource in groupVersion.
func servesResource(client kubernetes.Interface, groupVersion, resource string) bool {
	list, err := client.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

// firstPassKey is queued after the groups the caches hold at start; no
// group has this key (group keys are namespace/kind/name).
const firstPassKey = "\x00first-pass"

// Ready reports whether the controller has synced its caches and then
// every group they held once: from then on what it says about a group
// (annotations, conditions, events) is its own, not a predecessor's.
func (c *Controller) Ready() bool { return c.ready.Load() }

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if key == firstPassKey {
		c.queue.Forget(key)
		if !c.ready.Swap(true) {
			klog.FromContext(ctx).Info("Synced every pod group of the caches once; ready")
		}
		return true
	}
	for c.releases.Len() > 0 {
		r, quit := c.releases.Get()
		if quit {
			return false
		}
		c.syncKey(ctx, r)
		c.releases.Done(r)
	}
	c.syncKey(ctx, key)
	return true
}

// releaseAfter syncs a placed group after d, ahead of the groups queued
// by then; queue gets it too, in case the worker waits there.
func (c *Controller) releaseAfter(key string, d time.Duration) {
	c.releases.AddAfter(key, d)
	c.queue.AddAfter(key, d)
}

// syncKey syncs one group; a failed or refused group backs off in queue.
func (c *Controller) syncKey(ctx context.Context, key string) {
	res, err := c.sync(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("group", key)), key)
	switch {
	case err != nil:
		utilruntime.HandleErrorWithContext(ctx, err, "Syncing pod group failed", "group", key)
		c.queue.AddRateLimited(key)
	case res == backoff:
		c.queue.AddRateLimited(key)
	case res == writing:
		// The end of the group's writes forgets or backs off.
	default:
		c.queue.Forget(key)
	}
}

// updateUsage refreshes the utilization and fragmentation gauges.
func (c *Controller) updateUsage(context.Context) {
	cl, err := c.snapshotCluster()
	if err != nil {
		return
	}
	u := planner.Measure(c.index.snapshot(cl), nil)
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
