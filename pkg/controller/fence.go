package controller

// Fences: a device kube-scheduler lost count of.
//
// kube-scheduler keeps the devices that claims hold as a set, updated from
// claim events: one entry per device however many claims hold it, dropped
// when any one of them gives the device back. Two claims hold one device
// when an allocation the controller writes races one kube-scheduler had in
// flight (nothing in the API server stops it); the controller resolves the
// clash by giving its claim back (decide.go, clashes), and from then on
// kube-scheduler counts the device as free though the other claim still
// holds it, and hands it to the next pod that asks.
//
// So the controller fences such a device: a DeviceTaintRule with a
// NoSchedule taint (gputopo.dev/fenced) on it, which kube-scheduler's
// allocator (and the controller's) honours for new allocations, and which
// leaves the claim that holds it alone. The rule goes once no claim holds
// the device. Before the controller itself gives back a claim that shares
// a device, it fences the device first and waits until its own informer
// shows the rule, so the scheduler sees the rule at about the same time;
// a clash that others resolve (a pod deleted, a claim deallocated by
// kube-scheduler or the resource claim controller) is fenced when the
// controller sees the device given back. To know which devices are blind,
// the claim index keeps kube-scheduler's set the way kube-scheduler does,
// from the claim events in their order (claimIndex.observe), beside the
// claims that really hold each device. The rule is the record: after a
// restart, a fenced device stays fenced while a claim holds it.
//
// Where the API server does not serve DeviceTaintRules in resource.k8s.io/v1
// (Kubernetes 1.36 by default) there is nothing to fence with; the
// controller logs each device kube-scheduler lost count of.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/topology"
)

// fencer keeps a DeviceTaintRule on every device the claim index calls
// blind, and on no device that no claim holds.
type fencer struct {
	client kubernetes.Interface
	rules  resourcelisters.DeviceTaintRuleLister
	index  *claimIndex
	queue  workqueue.TypedRateLimitingInterface[structured.DeviceID]
	// onFence is called for each rule this process writes (metrics).
	onFence func()
}

func newFencer(client kubernetes.Interface, rules resourcelisters.DeviceTaintRuleLister, index *claimIndex, onFence func()) *fencer {
	return &fencer{client: client, rules: rules, index: index, onFence: onFence,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[structured.DeviceID](),
			workqueue.TypedRateLimitingQueueConfig[structured.DeviceID]{Name: "gputopo-fences"})}
}

// fenceName is the DeviceTaintRule of a device: readable where the names
// allow, unique through the hash of the whole device ID.
func fenceName(d structured.DeviceID) string {
	sum := sha256.Sum256([]byte(d.String()))
	readable := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, d.Pool.String()+"-"+d.Device.String())
	if len(readable) > 200 {
		readable = readable[:200]
	}
	return topology.FenceRulePrefix + strings.Trim(readable, "-") + "-" + hex.EncodeToString(sum[:4])
}

// fenceRule is the DeviceTaintRule that fences d.
func fenceRule(d structured.DeviceID, holder string) *resourceapi.DeviceTaintRule {
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:   fenceName(d),
			Labels: map[string]string{topology.LabelFence: "true"},
			Annotations: map[string]string{topology.AnnotationFenceReason: fmt.Sprintf(
				"device %s was allocated to two claims at once and one gave it back; kube-scheduler no longer counts it as allocated though %s holds it. gputopo's controller deletes this rule once no claim holds the device", d, holder)},
		},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{
				Driver: ptr.To(d.Driver.String()), Pool: ptr.To(d.Pool.String()), Device: ptr.To(d.Device.String()),
			},
			Taint: resourceapi.DeviceTaint{Key: topology.TaintFenced, Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
}

// fencedDevice is the device a rule of ours fences, false for any other
// rule.
func fencedDevice(r *resourceapi.DeviceTaintRule) (structured.DeviceID, bool) {
	s := r.Spec.DeviceSelector
	if r.Labels[topology.LabelFence] != "true" || s == nil || s.Driver == nil || s.Pool == nil || s.Device == nil {
		return structured.DeviceID{}, false
	}
	return structured.MakeDeviceID(*s.Driver, *s.Pool, *s.Device), true
}

// gaveBack hears of a device a claim gave back (claimIndex.gaveBack).
func (f *fencer) gaveBack(d structured.DeviceID) { f.queue.Add(d) }

// handler queues the device of each of our rules that changes, so that a
// rule deleted by hand while its device is blind is written again.
func (f *fencer) handler() cache.ResourceEventHandler {
	queue := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if r, ok := obj.(*resourceapi.DeviceTaintRule); ok {
			if d, ok := fencedDevice(r); ok {
				f.queue.Add(d)
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: queue, UpdateFunc: func(_, o any) { queue(o) }, DeleteFunc: queue}
}

func (f *fencer) run(ctx context.Context) {
	defer f.queue.ShutDown()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for f.next(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
}

func (f *fencer) next(ctx context.Context) bool {
	d, quit := f.queue.Get()
	if quit {
		return false
	}
	defer f.queue.Done(d)
	if err := f.sync(ctx, d); err != nil {
		klog.FromContext(ctx).Error(err, "Fencing a device failed; retrying", "device", d)
		f.queue.AddRateLimited(d)
		return true
	}
	f.queue.Forget(d)
	return true
}

// fenceAction is what sync does about one device.
type fenceAction int

const (
	fenceKeep fenceAction = iota
	fenceCreate
	fenceDelete
)

// decideFence: a blind device that a claim holds gets a rule; a rule
// stays while a claim holds its device (after a restart the rule is all
// that says the device is blind) and goes once none does.
func decideFence(blind bool, holders int, ruled bool) fenceAction {
	switch {
	case holders == 0 && ruled:
		return fenceDelete
	case holders > 0 && blind && !ruled:
		return fenceCreate
	}
	return fenceKeep
}

func (f *fencer) sync(ctx context.Context, d structured.DeviceID) error {
	blind, holders := f.index.isBlind(d)
	rule, err := f.rules.Get(fenceName(d))
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	switch decideFence(blind, holders, rule != nil) {
	case fenceCreate:
		return f.create(ctx, d, false)
	case fenceDelete:
		err := f.client.ResourceV1().DeviceTaintRules().Delete(ctx, rule.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(rule.UID)}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete DeviceTaintRule %s: %w", rule.Name, err)
		}
		klog.FromContext(ctx).V(2).Info("No claim holds the fenced device any more; removed its DeviceTaintRule", "device", d, "rule", rule.Name)
	}
	return nil
}

// create writes the rule that fences d; with wait, it returns once the
// informer shows it (or after a second).
func (f *fencer) create(ctx context.Context, d structured.DeviceID, waitSeen bool) error {
	holder := strings.Join(f.index.holderKeys(d), ", ")
	rule := fenceRule(d, holder)
	_, err := f.client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil
	case err != nil:
		return fmt.Errorf("create DeviceTaintRule %s: %w", rule.Name, err)
	}
	klog.FromContext(ctx).Info("Fenced a device kube-scheduler no longer counts as allocated", "device", d, "holders", holder, "rule", rule.Name)
	if f.onFence != nil {
		f.onFence()
	}
	if waitSeen {
		_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
			_, err := f.rules.Get(rule.Name)
			return err == nil, nil
		})
	}
	return nil
}

// beforeGivingBack fences the devices of claim that other claims hold too,
// before the controller gives the claim back.
func (f *fencer) beforeGivingBack(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	// Only devices held whole go blind: kube-scheduler keeps shares
	// apart, and takes a share it forgets out of what it counts.
	for d := range f.index.wholeSharers(claim.UID) {
		if _, err := f.rules.Get(fenceName(d)); err == nil {
			continue
		}
		if err := f.create(ctx, d, true); err != nil {
			return err
		}
	}
	return nil
}

// resync queues the device of every rule of ours, for a controller that
// starts: a rule whose device no claim holds any more goes.
func (f *fencer) resync() error {
	rules, err := f.rules.List(labels.SelectorFromSet(labels.Set{topology.LabelFence: "true"}))
	if err != nil {
		return err
	}
	for _, r := range rules {
		if d, ok := fencedDevice(r); ok {
			f.queue.Add(d)
		}
	}
	return nil
}

// fenceClaimsOf fences, before the controller deletes a pod that gives
// way in a clash, the devices its claims share with other claims: the
// claims made for it go with it.
func (c *Controller) fenceClaimsOf(ctx context.Context, p *v1.Pod) error {
	if c.fences == nil {
		return nil
	}
	claims, err := c.podClaims(p)
	if err != nil {
		return nil // its claims are not all there; each is fenced when it goes
	}
	for _, cl := range claims {
		if err := c.fences.beforeGivingBack(ctx, cl); err != nil {
			return err
		}
	}
	return nil
}
