package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Event reasons explain reads from other components than gputopo.
const (
	// EventFailedResourceClaimCreation: the resource claim controller
	// could not create a pod's claim (a missing ResourceClaimTemplate).
	EventFailedResourceClaimCreation = "FailedResourceClaimCreation"
	// EventFailedScheduling: kube-scheduler could not place a pod.
	EventFailedScheduling = "FailedScheduling"
)

// ClusterState is what explain reads beyond a group's pods, claims and
// events to say why a pod that no gputopo gate holds waits: the nodes and
// their devices, every allocated claim, DeviceClasses, DeviceTaintRules
// and the ResourceClaimTemplates of the pods' namespace.
type ClusterState struct {
	Nodes      []v1.Node
	Slices     []resourceapi.ResourceSlice
	Claims     []resourceapi.ResourceClaim // every namespace
	Classes    []resourceapi.DeviceClass
	TaintRules []resourceapi.DeviceTaintRule
	Templates  []resourceapi.ResourceClaimTemplate // the pods' namespace

	check *fitCheck // built for the first pod that needs it
}

// podEvents are the events about one pod, oldest first.
func podEvents(events []v1.Event, pod string) []v1.Event {
	var out []v1.Event
	for _, e := range events {
		if e.InvolvedObject.Name == pod && (e.InvolvedObject.Kind == "" || e.InvolvedObject.Kind == "Pod") {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b v1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	return out
}

func eventTime(e v1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// lastEvent is the newest event with reason, or nil.
func lastEvent(evs []v1.Event, reason string) *v1.Event {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Reason == reason {
			return &evs[i]
		}
	}
	return nil
}

// schedulerSays is the scheduler's newest word on why the pod is not
// scheduled: its FailedScheduling event, else the PodScheduled condition.
func schedulerSays(p *v1.Pod, evs []v1.Event) string {
	if e := lastEvent(evs, EventFailedScheduling); e != nil {
		return e.Message
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return ""
}

// startingWhy says why a bound pod is not running yet: the newest
// Warning event about it, else the reason its first waiting container
// gives.
func startingWhy(p *v1.Pod, evs []v1.Event) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == v1.EventTypeWarning {
			return evs[i].Reason + ": " + evs[i].Message
		}
	}
	for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if w := s.State.Waiting; w != nil {
			return strings.TrimSuffix(fmt.Sprintf("container %s: %s: %s", s.Name, w.Reason, w.Message), ": ")
		}
	}
	return ""
}

// otherGates are the pod's scheduling gates that are not gputopo's.
func otherGates(p *v1.Pod) []string {
	var out []string
	for _, g := range p.Spec.SchedulingGates {
		if g.Name != placement.SchedulingGate {
			out = append(out, g.Name)
		}
	}
	return out
}

// missingClaims says, for each claim of the pod that does not exist, why
// and what to do; empty when every claim exists.
func missingClaims(p *v1.Pod, byName map[string]*resourceapi.ResourceClaim, evs []v1.Event, templates []resourceapi.ResourceClaimTemplate) []string {
	made := map[string]*string{}
	for _, s := range p.Status.ResourceClaimStatuses {
		made[s.Name] = s.ResourceClaimName
	}
	var out []string
	for i, pc := range p.Spec.ResourceClaims {
		switch {
		case pc.ResourceClaimName != nil:
			if byName[*pc.ResourceClaimName] == nil {
				out = append(out, fmt.Sprintf("ResourceClaim %s/%s, which the pod's claim %q names, does not exist: create it, or name an existing claim in spec.resourceClaims[%d].resourceClaimName",
					p.Namespace, *pc.ResourceClaimName, pc.Name, i))
			}
		case pc.ResourceClaimTemplateName != nil:
			name, ok := made[pc.Name]
			if ok && name == nil {
				continue // the claim controller decided none is needed
			}
			if ok && byName[*name] != nil {
				continue
			}
			tmpl := *pc.ResourceClaimTemplateName
			if !slices.ContainsFunc(templates, func(t resourceapi.ResourceClaimTemplate) bool { return t.Name == tmpl }) {
				out = append(out, fmt.Sprintf("ResourceClaimTemplate %s/%s, which the pod's claim %q names, does not exist: create it in namespace %s (kubectl get resourceclaimtemplates -A lists those that do), or fix spec.resourceClaims[%d].resourceClaimTemplateName",
					p.Namespace, tmpl, pc.Name, p.Namespace, i))
				continue
			}
			if e := lastEvent(evs, EventFailedResourceClaimCreation); e != nil {
				out = append(out, "the resource claim controller cannot create the pod's claim: "+e.Message)
				continue
			}
			out = append(out, fmt.Sprintf("the ResourceClaim for the pod's claim %q is not created yet from template %s/%s: the resource claim controller (in kube-controller-manager) creates it; if this lasts, check that kube-controller-manager runs with DRA enabled",
				pc.Name, p.Namespace, tmpl))
		}
	}
	return out
}

// claimsOf are the pod's existing claims.
func claimsOf(p *v1.Pod, byName map[string]*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, n := range podClaimNames(p) {
		if c := byName[n]; c != nil {
			out = append(out, c)
		}
	}
	return out
}

// fitCheck evaluates a pod's claims against the live devices.
type fitCheck struct {
	cs      *ClusterState
	eval    *devicefit.Evaluator
	slices  []*resourceapi.ResourceSlice // taint rules applied
	bare    []*resourceapi.ResourceSlice // every device taint removed
	state   devicefit.State
	nodes   []*v1.Node // nodes with devices
	ruleFor map[string]string
	// memo holds the answers of fits: the pods of a Job ask the same.
	memo map[string]fitAnswer
}

type fitAnswer struct {
	nodes []*v1.Node
	res   [][]resourceapi.AllocationResult
	err   error
}

// fitCheckFor is the cluster's fit check, built once. Its state holds
// every allocated claim, the pod's own too: a pod's allocated claim
// holds its devices against its other claims.
func fitCheckFor(cs *ClusterState) *fitCheck {
	if cs.check == nil {
		cs.check = newFitCheck(cs)
	}
	return cs.check
}

func newFitCheck(cs *ClusterState) *fitCheck {
	f := &fitCheck{cs: cs, state: devicefit.NewState(), ruleFor: map[string]string{}, memo: map[string]fitAnswer{}}
	classes := make([]*resourceapi.DeviceClass, len(cs.Classes))
	for i := range cs.Classes {
		classes[i] = &cs.Classes[i]
	}
	f.eval = devicefit.NewEvaluator(devicefit.NewClasses(classes...))
	pools := map[string]bool{}
	for i := range cs.Slices {
		s := cs.Slices[i].DeepCopy()
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			for _, r := range cs.TaintRules {
				if taintRuleSelects(&r, s.Spec.Driver, s.Spec.Pool.Name, d.Name) {
					d.Taints = append(d.Taints, r.Spec.Taint)
					f.ruleFor[taintString(r.Spec.Taint)] = r.Name
				}
			}
		}
		f.slices = append(f.slices, s)
		b := s.DeepCopy()
		for j := range b.Spec.Devices {
			b.Spec.Devices[j].Taints = nil
		}
		f.bare = append(f.bare, b)
		if s.Spec.NodeName != nil {
			pools[*s.Spec.NodeName] = true
		}
		if s.Spec.AllNodes != nil && *s.Spec.AllNodes || s.Spec.NodeSelector != nil {
			for _, n := range cs.Nodes {
				pools[n.Name] = true
			}
		}
	}
	for i := range cs.Nodes {
		if pools[cs.Nodes[i].Name] {
			f.nodes = append(f.nodes, &cs.Nodes[i])
		}
	}
	for i := range cs.Claims {
		c := &cs.Claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		f.state.Add(*c.Status.Allocation)
	}
	return f
}

func taintRuleSelects(r *resourceapi.DeviceTaintRule, driver, pool, device string) bool {
	s := r.Spec.DeviceSelector
	if s == nil {
		return true
	}
	return (s.Driver == nil || *s.Driver == driver) && (s.Pool == nil || *s.Pool == pool) && (s.Device == nil || *s.Device == device)
}

func taintString(t resourceapi.DeviceTaint) string {
	s := t.Key
	if t.Value != "" {
		s += "=" + t.Value
	}
	return s + ":" + string(t.Effect)
}

// fits lists the nodes where claims fit together on top of state.
func (f *fitCheck) fits(ctx context.Context, sl []*resourceapi.ResourceSlice, state devicefit.State, claims []*resourceapi.ResourceClaim, among []*v1.Node) ([]*v1.Node, [][]resourceapi.AllocationResult, error) {
	key, err := f.key(sl, state, claims, among)
	if err != nil {
		return nil, nil, err
	}
	if a, ok := f.memo[key]; ok {
		return a.nodes, a.res, a.err
	}
	nodes, res, err := f.fitsOn(ctx, sl, state, claims, among)
	f.memo[key] = fitAnswer{nodes, res, err}
	return nodes, res, err
}

// key says what fits asks: which devices, on top of what, the claims'
// specs (not their names) and the nodes.
func (f *fitCheck) key(sl []*resourceapi.ResourceSlice, state devicefit.State, claims []*resourceapi.ResourceClaim, among []*v1.Node) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "%t %t\n", len(sl) > 0 && len(f.bare) > 0 && sl[0] == f.bare[0], state.Devices.Len() == 0 && state.ShareIDs.Len() == 0)
	for _, c := range claims {
		spec, err := json.Marshal(c.Spec)
		if err != nil {
			return "", err
		}
		b.Write(spec)
		b.WriteByte('\n')
	}
	for _, n := range among {
		b.WriteString(n.Name + " ")
	}
	return b.String(), nil
}

func (f *fitCheck) fitsOn(ctx context.Context, sl []*resourceapi.ResourceSlice, state devicefit.State, claims []*resourceapi.ResourceClaim, among []*v1.Node) ([]*v1.Node, [][]resourceapi.AllocationResult, error) {
	var out []*v1.Node
	var res [][]resourceapi.AllocationResult
	for _, n := range among {
		r, err := f.eval.AllocateOn(ctx, n, sl, state.Allocator(), claims)
		if err != nil {
			return nil, nil, err
		}
		if r != nil {
			out = append(out, n)
			res = append(res, r)
		}
	}
	return out, res, nil
}

// nodeFilter says why the pod cannot go to n whatever its devices, or "".
func nodeFilter(p *v1.Pod, n *v1.Node) string {
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			ready = c.Status == v1.ConditionTrue
		}
	}
	logger := klog.Background()
	if !ready {
		return "NotReady"
	}
	if n.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(logger, p.Spec.Tolerations,
		&v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}, true) {
		return "cordoned"
	}
	if t, bad := corev1helpers.FindMatchingUntoleratedTaint(logger, n.Spec.Taints, p.Spec.Tolerations, func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
	}, true); bad {
		return "with untolerated taint " + t.ToString()
	}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(n); !ok || err != nil {
		return "not matching the pod's node selector or affinity"
	}
	return ""
}

// diagnose says what keeps a pod that no gate holds from being scheduled:
// missing claims, claims that fit no device anywhere (and why), claims
// whose devices are all taken, and nodes ruled out.
func diagnose(ctx context.Context, p *v1.Pod, byName map[string]*resourceapi.ResourceClaim, evs []v1.Event, cs *ClusterState) []string {
	if out := missingClaims(p, byName, evs, cs.Templates); len(out) > 0 {
		return out
	}
	own := claimsOf(p, byName)
	pending := unallocated(own)
	f := fitCheckFor(cs)
	candidates := f.nodes
	for _, c := range own {
		if c.Status.Allocation == nil {
			continue
		}
		node := allocationNode(c.Status.Allocation)
		if node == "" {
			continue
		}
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(n *v1.Node) bool { return n.Name != node })
		if len(candidates) == 0 {
			return []string{fmt.Sprintf("claim %s is allocated on node %s, which does not exist or publishes no devices: delete the claim so that it is allocated again", c.Name, node)}
		}
	}
	if out, blocked := diagnoseClaims(ctx, pending, f); blocked {
		return out
	}
	fit, _, err := f.fits(ctx, f.slices, f.state, pending, candidates)
	if err != nil {
		return []string{fmt.Sprintf("the pod's claims cannot be allocated: %v", err)}
	}
	if len(fit) == 0 {
		return []string{fmt.Sprintf("each of the pod's %d claims fits on some node, but no node holds all of them together now", len(pending))}
	}
	why := map[string]int{}
	var ok []*v1.Node
	for _, n := range fit {
		if w := nodeFilter(p, n); w != "" {
			why[w]++
		} else {
			ok = append(ok, n)
		}
	}
	if len(ok) == 0 {
		parts := make([]string, 0, len(why))
		for _, w := range slices.Sorted(maps.Keys(why)) {
			parts = append(parts, fmt.Sprintf("%d %s", why[w], w))
		}
		return []string{fmt.Sprintf("the pod's claims fit on %s, but the pod may not run there: %s; make the node Ready, add a toleration for the taint, or change the pod's node selector",
			nodeList(fit), strings.Join(parts, ", "))}
	}
	if len(pending) > 0 {
		return []string{fmt.Sprintf("the pod's claims fit now on %s and the pod may run there: what stops it is not its devices (see the scheduler's message: cpu, memory, pod affinity)", nodeList(ok))}
	}
	return nil
}

// unallocated are the claims that have no allocation yet.
func unallocated(claims []*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, c := range claims {
		if c.Status.Allocation == nil {
			out = append(out, c)
		}
	}
	return out
}

// diagnoseClaims says, for each claim on its own, why it cannot be
// allocated on any node: its selectors fail or match no device even with
// every device free (and why), or other claims hold every device it
// matches now. blocked is set when some claim cannot be allocated now.
// Claims that fit are not mentioned.
func diagnoseClaims(ctx context.Context, pending []*resourceapi.ResourceClaim, f *fitCheck) (out []string, blocked bool) {
	if len(pending) > 0 && len(f.nodes) == 0 {
		return []string{"no node publishes devices (ResourceSlices): install gputopo, or wait for its kubelet plugins to start"}, true
	}
	for _, c := range pending {
		one := []*resourceapi.ResourceClaim{c}
		empty, _, err := f.fits(ctx, f.slices, devicefit.NewState(), one, f.nodes)
		if err != nil {
			// A selector that reads an attribute a device lacks fails in
			// CEL rather than not matching.
			if u := f.unknownAttributes(c, "claim "+c.Name+" cannot be allocated on any node"); len(u) > 0 {
				out = append(out, u...)
			} else {
				out = append(out, fmt.Sprintf("claim %s cannot be allocated: %v", c.Name, err))
			}
			blocked = true
			continue
		}
		if len(empty) == 0 {
			out = append(out, f.noDevice(ctx, c)...)
			blocked = true
			continue
		}
		now, _, err := f.fits(ctx, f.slices, f.state, one, empty)
		if err != nil {
			out = append(out, fmt.Sprintf("claim %s cannot be allocated: %v", c.Name, err))
			blocked = true
			continue
		}
		if len(now) == 0 {
			out = append(out, fmt.Sprintf("claim %s fits on %s when their devices are free, but other claims hold all the devices it matches there now: it waits for them to be freed (kubectl gputopo topology shows who holds them)",
				c.Name, nodeList(empty)))
			blocked = true
		}
	}
	return out, blocked
}

// noDevice explains a claim that fits no node even with every device
// free: an attribute its selectors name that no device has, a share
// while no GPU is shared, device taints, or else its selectors.
func (f *fitCheck) noDevice(ctx context.Context, c *resourceapi.ResourceClaim) []string {
	head := fmt.Sprintf("claim %s fits on none of the %s even with every device free", c.Name, plural(len(f.nodes), "node with devices"))
	var out []string
	exprs := f.selectors(c)
	shared := false
	for _, s := range f.cs.Slices {
		for _, d := range s.Spec.Devices {
			shared = shared || d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		}
	}
	out = append(out, f.unknownAttributes(c, head)...)
	if asksShare(c) && !shared {
		out = append(out, fmt.Sprintf("%s: it asks for a share of a GPU (capacity %s), and no GPU is published for sharing: label a node %s=all, or start the kubelet plugin with --shared-gpus=all (chart: kubeletPlugin.sharedGPUs)",
			head, strings.Join(shareNames(c), ", "), topology.LabelSharedGPUs))
	}
	if len(out) > 0 {
		return out
	}
	if untainted, res, err := f.fits(ctx, f.bare, devicefit.NewState(), []*resourceapi.ResourceClaim{c}, f.nodes); err == nil && len(untainted) > 0 {
		taints := map[string]bool{}
		for _, r := range res {
			for _, d := range r[0].Devices.Results {
				for _, t := range f.deviceTaints(d.Driver, d.Pool, d.Device) {
					s := taintString(t)
					if rule := f.ruleFor[s]; rule != "" {
						s += " (DeviceTaintRule " + rule + ")"
					}
					taints[s] = true
				}
			}
		}
		return []string{fmt.Sprintf("%s: the devices it matches on %s carry taints it does not tolerate: %s; remove the DeviceTaintRule or repair the device, or add a toleration to the claim's request",
			head, nodeList(untainted), strings.Join(slices.Sorted(maps.Keys(taints)), ", "))}
	}
	if len(exprs) > 0 {
		return []string{fmt.Sprintf("%s: no device matches its selectors (%s) together with its count and constraints: compare them with the devices' attributes (kubectl get resourceslices -o yaml)", head, strings.Join(exprs, "; "))}
	}
	return []string{head + ": its requests ask for more devices than any node has (or of a class no device belongs to)"}
}

// unknownAttributes names each attribute or capacity the claim's
// selectors read that no device has.
func (f *fitCheck) unknownAttributes(c *resourceapi.ResourceClaim, head string) []string {
	known := map[string]bool{}
	for _, s := range f.cs.Slices {
		for _, d := range s.Spec.Devices {
			for name := range d.Attributes {
				known[qualify(s.Spec.Driver, string(name))] = true
			}
			for name := range d.Capacity {
				known[qualify(s.Spec.Driver, string(name))] = true
			}
		}
	}
	var out, seen []string
	for _, e := range f.selectors(c) {
		for _, m := range attrRE.FindAllStringSubmatch(e, -1) {
			name := qualify(m[1], m[2]+m[3])
			if known[name] || slices.Contains(seen, name) {
				continue
			}
			seen = append(seen, name)
			out = append(out, fmt.Sprintf("%s: its selector names the attribute %s, which no device has: check its spelling against the attributes gputopo publishes (README, Device attributes)", head, name))
		}
	}
	return out
}

func (f *fitCheck) deviceTaints(driver, pool, device string) []resourceapi.DeviceTaint {
	for _, s := range f.slices {
		if s.Spec.Driver != driver || s.Spec.Pool.Name != pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				return d.Taints
			}
		}
	}
	return nil
}

// attrRE finds device.attributes["domain"].name,
// device.attributes["domain"]["name"] and the same for capacity.
var attrRE = regexp.MustCompile(`device\.(?:attributes|capacity)\["([^"]+)"\](?:\.([A-Za-z_][A-Za-z0-9_]*)|\["([^"]+)"\])`)

func qualify(domain, name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return domain + "/" + name
}

// selectors are the CEL expressions of the claim's requests (not of their
// classes, which select the driver).
func (f *fitCheck) selectors(c *resourceapi.ResourceClaim) []string {
	var out []string
	add := func(sel []resourceapi.DeviceSelector) {
		for _, s := range sel {
			if s.CEL != nil {
				out = append(out, s.CEL.Expression)
			}
		}
	}
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			add(r.Exactly.Selectors)
		}
		for _, s := range r.FirstAvailable {
			add(s.Selectors)
		}
	}
	return out
}

func asksShare(c *resourceapi.ResourceClaim) bool { return len(shareNames(c)) > 0 }

func shareNames(c *resourceapi.ResourceClaim) []string {
	names := map[string]bool{}
	add := func(cr *resourceapi.CapacityRequirements) {
		if cr == nil {
			return
		}
		for n := range cr.Requests {
			names[string(n)] = true
		}
	}
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			add(r.Exactly.Capacity)
		}
		for _, s := range r.FirstAvailable {
			add(s.Capacity)
		}
	}
	return slices.Sorted(maps.Keys(names))
}

func nodeList(nodes []*v1.Node) string {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	if len(names) > 4 {
		return fmt.Sprintf("%d nodes (%s, ...)", len(names), strings.Join(names[:4], ", "))
	}
	if len(names) == 1 {
		return "node " + names[0]
	}
	return "nodes " + strings.Join(names, ", ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	word, rest, ok := strings.Cut(what, " ")
	if ok {
		rest = " " + rest
	}
	return fmt.Sprintf("%d %ss%s", n, word, rest)
}
