package controller

import (
	"context"
	"maps"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/nodepin"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Node selectors for claims that pin a leaf or spine in CEL. kube-scheduler
// runs the DRA allocator, the claim's CEL over every device, on each node
// it tries; a claim that selects one leaf's GPUs therefore costs it the
// whole cluster per pod, where a node selector on the leaf label would
// cost a label lookup. pinSync keeps, in each namespace whose
// ResourceClaimTemplates or ResourceClaims (those a user created, not
// those made from a template) pin a tier, the ConfigMap
// nodepin.ConfigMapName: "template.<name>" or "claim.<name>" → the node
// selector the pins imply. The gputopo-claim-node-selector
// MutatingAdmissionPolicy reads it for each new pod of the namespace and
// adds that selector to the pod. The claims stay as written; the selector
// never rules out a node the CEL would allow (nodepin), and a node label
// that differs between nodes (two label keys for the leaf) gives none.

// allNamespaces, queued, recomputes every namespace that has templates,
// user claims or a ConfigMap of ours.
const allNamespaces = "*"

type pinSync struct {
	client kubernetes.Interface
	tmpls  resourcelisters.ResourceClaimTemplateLister
	claims resourcelisters.ResourceClaimLister
	nodes  corelisters.NodeLister
	cms    corelisters.ConfigMapLister
	cmInf  cache.SharedIndexInformer
	cmFact informers.SharedInformerFactory
	queue  workqueue.TypedRateLimitingInterface[string]
	synced []cache.InformerSynced

	mu      sync.Mutex
	network topology.LabelMapping
	keys    map[string]string          // nodepin.LabelKeys, nil until computed
	pins    map[types.UID]nodepin.Pins // templates' and claims' specs are immutable
}

func newPinSync(client kubernetes.Interface, f informers.SharedInformerFactory, network topology.LabelMapping) (*pinSync, error) {
	cmFact := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute, informers.WithTransform(dropManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + nodepin.ConfigMapName }))
	s := &pinSync{
		client:  client,
		tmpls:   f.Resource().V1().ResourceClaimTemplates().Lister(),
		claims:  f.Resource().V1().ResourceClaims().Lister(),
		nodes:   f.Core().V1().Nodes().Lister(),
		cms:     cmFact.Core().V1().ConfigMaps().Lister(),
		cmInf:   cmFact.Core().V1().ConfigMaps().Informer(),
		cmFact:  cmFact,
		network: network,
		pins:    map[types.UID]nodepin.Pins{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gputopo-claim-node-selectors"}),
	}
	ns := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			s.queue.Add(m.GetNamespace())
		}
	}
	userClaim := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if c, ok := obj.(*resourceapi.ResourceClaim); ok && !fromTemplate(c) {
			s.queue.Add(c.Namespace)
		}
	}
	nodeLabels := func(old, cur any) {
		o, _ := old.(*v1.Node)
		n, _ := cur.(*v1.Node)
		if o == nil || n == nil || !maps.Equal(o.Labels, n.Labels) {
			s.relabel()
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{f.Resource().V1().ResourceClaimTemplates().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: ns, UpdateFunc: func(_, o any) { ns(o) }, DeleteFunc: ns}},
		{f.Resource().V1().ResourceClaims().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: userClaim, DeleteFunc: userClaim}},
		{f.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: func(o any) { nodeLabels(nil, o) }, UpdateFunc: nodeLabels, DeleteFunc: func(o any) { nodeLabels(nil, o) }}},
		// Added too: a sync that ran before its own create came back
		// through the watch saw no ConfigMap, and must look again.
		{s.cmInf, cache.ResourceEventHandlerFuncs{AddFunc: ns, UpdateFunc: func(_, o any) { ns(o) }, DeleteFunc: ns}},
	} {
		reg, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return nil, err
		}
		s.synced = append(s.synced, reg.HasSynced)
	}
	return s, nil
}

// fromTemplate reports whether the claim was made from its pod's
// template: the pod names the template, whose entry covers it.
func fromTemplate(c *resourceapi.ResourceClaim) bool {
	_, ok := c.Annotations[resourceapi.PodResourceClaimAnnotation]
	return ok
}

// relabel forgets the label keys, which the next pass computes again.
func (s *pinSync) relabel() {
	s.mu.Lock()
	s.keys = nil
	s.mu.Unlock()
	s.queue.Add(allNamespaces)
}

// setLabelMapping follows the controller's label mapping.
func (s *pinSync) setLabelMapping(m topology.LabelMapping) {
	s.mu.Lock()
	s.network = m
	s.mu.Unlock()
	s.relabel()
}

// run starts the ConfigMap informer and serves the queue until ctx ends.
func (s *pinSync) run(ctx context.Context) {
	defer s.queue.ShutDown()
	s.cmFact.Start(ctx.Done())
	defer s.cmFact.Shutdown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, append(s.synced, s.cmInf.HasSynced)...) {
		return
	}
	s.queue.Add(allNamespaces)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for s.next(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
}

func (s *pinSync) next(ctx context.Context) bool {
	ns, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(ns)
	var err error
	if ns == allNamespaces {
		err = s.syncAll(ctx)
	} else {
		err = s.sync(ctx, ns)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Keeping the claims' node selectors failed; retrying", "namespace", ns)
		s.queue.AddRateLimited(ns)
		return true
	}
	s.queue.Forget(ns)
	return true
}

func (s *pinSync) syncAll(ctx context.Context) error {
	namespaces := map[string]bool{}
	tmpls, err := s.tmpls.List(everything)
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		namespaces[t.Namespace] = true
	}
	claims, err := s.claims.List(everything)
	if err != nil {
		return err
	}
	for _, c := range claims {
		if !fromTemplate(c) {
			namespaces[c.Namespace] = true
		}
	}
	cms, err := s.cms.List(everything)
	if err != nil {
		return err
	}
	for _, cm := range cms {
		namespaces[cm.Namespace] = true
	}
	s.forget()
	for ns := range namespaces {
		if err := s.sync(ctx, ns); err != nil {
			return err
		}
	}
	return nil
}

// labelKeys returns nodepin.LabelKeys for the nodes as they are now.
func (s *pinSync) labelKeys() (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys != nil {
		return s.keys, nil
	}
	nodes, err := s.nodes.List(everything)
	if err != nil {
		return nil, err
	}
	labels := make([]map[string]string, len(nodes))
	for i, n := range nodes {
		labels[i] = n.Labels
	}
	s.keys = nodepin.LabelKeys(labels, s.network)
	return s.keys, nil
}

func (s *pinSync) pinsOf(uid types.UID, spec *resourceapi.ResourceClaimSpec) nodepin.Pins {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pins[uid]
	if !ok {
		p = nodepin.FromClaim(spec)
		s.pins[uid] = p
	}
	return p
}

// desired is the data of the namespace's ConfigMap: empty when nothing
// there pins a tier.
func (s *pinSync) desired(ns string) (map[string]string, error) {
	keys, err := s.labelKeys()
	if err != nil {
		return nil, err
	}
	data := map[string]string{}
	tmpls, err := s.tmpls.ResourceClaimTemplates(ns).List(everything)
	if err != nil {
		return nil, err
	}
	for _, t := range tmpls {
		if sel := nodepin.Selector(s.pinsOf(t.UID, &t.Spec.Spec), keys); sel != nil {
			data[nodepin.TemplateKeyPrefix+t.Name] = nodepin.Format(sel)
		}
	}
	claims, err := s.claims.ResourceClaims(ns).List(everything)
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		if fromTemplate(c) {
			continue
		}
		if sel := nodepin.Selector(s.pinsOf(c.UID, &c.Spec), keys); sel != nil {
			data[nodepin.ClaimKeyPrefix+c.Name] = nodepin.Format(sel)
		}
	}
	return data, nil
}

// sync writes the namespace's ConfigMap as desired says: created,
// updated, or deleted when nothing pins.
func (s *pinSync) sync(ctx context.Context, ns string) error {
	data, err := s.desired(ns)
	if err != nil {
		return err
	}
	cur, err := s.cms.ConfigMaps(ns).Get(nodepin.ConfigMapName)
	if apierrors.IsNotFound(err) {
		cur, err = nil, nil
	}
	if err != nil {
		return err
	}
	cms := s.client.CoreV1().ConfigMaps(ns)
	switch {
	case cur == nil && len(data) == 0:
		return nil
	case cur == nil:
		cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: nodepin.ConfigMapName, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "gputopo-controller", topology.LabelClaimNodeSelectors: "true"}}, Data: data}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) || apierrors.IsForbidden(err) && strings.Contains(err.Error(), "being terminated") {
			return nil // the informer brings it, or the namespace goes
		}
	case len(data) == 0:
		err = cms.Delete(ctx, nodepin.ConfigMapName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}})
		if apierrors.IsNotFound(err) {
			return nil
		}
	case !maps.Equal(cur.Data, data) || cur.Labels[topology.LabelClaimNodeSelectors] != "true":
		// The label too: the admission policy selects the ConfigMap by it,
		// and one written before it was labelled has none.
		cm := cur.DeepCopy()
		cm.Data = data
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		cm.Labels[topology.LabelClaimNodeSelectors] = "true"
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	default:
		return nil
	}
	if err == nil {
		klog.FromContext(ctx).V(2).Info("Claims' node selectors written", "namespace", ns, "entries", len(data))
	}
	return err
}

// forget drops the cached pins of deleted templates and claims; every
// full pass calls it.
func (s *pinSync) forget() {
	live := map[types.UID]bool{}
	if tmpls, err := s.tmpls.List(everything); err == nil {
		for _, t := range tmpls {
			live[t.UID] = true
		}
	}
	if claims, err := s.claims.List(everything); err == nil {
		for _, c := range claims {
			live[c.UID] = true
		}
	}
	s.mu.Lock()
	maps.DeleteFunc(s.pins, func(uid types.UID, _ nodepin.Pins) bool { return !live[uid] })
	s.mu.Unlock()
}
