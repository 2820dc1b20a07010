package soak

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// view is one look at the cluster, listed in this order: claims first, so
// that a consumer a claim names and the pod list lacks is really gone.
type view struct {
	at      time.Time
	claims  []resourcev1.ResourceClaim
	pods    []corev1.Pod
	nodes   []corev1.Node
	slices  []resourcev1.ResourceSlice
	jobs    []batchv1.Job
	classes []resourcev1.DeviceClass
}

// Invariants, numbered as the summary and the breach reports name them.
const (
	invDevices  = 1 // no device in two allocated claims beyond what sharing allows
	invConsumer = 2 // no allocated claim without a live consumer for long
	invWaiting  = 3 // no opted-in pod waits long while its group fits
	invEnd      = 4 // nothing allocated once the workload is deleted
)

var invariantNames = map[int]string{
	invDevices:  "no device in two allocated claims (shares within capacity)",
	invConsumer: "no allocated claim without a live consumer for more than the limit",
	invWaiting:  "no opted-in pod waiting past the limit while the planner finds its group a place",
	invEnd:      "nothing allocated after the workload is deleted",
}

// breach is one invariant that did not hold, with what was seen.
type breach struct {
	invariant int
	at        time.Time
	what      string
}

func (b breach) String() string {
	return fmt.Sprintf("invariant %d (%s) breached at %s:\n%s", b.invariant, invariantNames[b.invariant], b.at.Format("15:04:05.000"), b.what)
}

// limits of the timed invariants.
type limits struct {
	// unconsumed is how long a claim may stay allocated without a live
	// consumer.
	unconsumed time.Duration
	// waiting is how long an opted-in pod may stay unbound while the
	// planner finds its group a place: the controller's bind timeout plus
	// 30 s.
	waiting time.Duration
	// reserved is added to waiting for a group the controller says fits
	// only on nodes another group reserved: its reservation timeout.
	reserved time.Duration
	// clash is how long a device may stay held beyond what it allows
	// while at most one of its holders' claims has a bound consumer. The
	// controller and kube-scheduler allocate independently: a claim each
	// writes in the same instant can name one device, and the controller
	// takes its own back (DeviceConflict) before its pod binds. Two
	// holders with bound consumers breach at once.
	clash time.Duration
}

// checker checks views one after the other; the timed invariants keep
// what earlier views showed.
type checker struct {
	limits limits
	oracle *oracle
	// unconsumedSince: claim → when it was first seen allocated without a
	// live consumer, in the run of views that showed it so.
	unconsumedSince map[types.UID]time.Time
	// fitsSince: group → when the planner first found it a place, in the
	// run of views that all did.
	fitsSince map[string]time.Time
	// clashSince: a device held beyond what it allows, by the same claims
	// → when it was first seen so, in the run of views that showed it.
	clashSince map[string]time.Time
	// clashes counts the clashes seen and repaired within the limit.
	clashes, repaired int
	// checks counts the checks run, by invariant.
	checks map[int]int
	// longest is the longest a pending pod had waited, in a check, since
	// its group fitted; longestPod names it.
	longest    time.Duration
	longestPod string
	// answers counts the planner's answers for waiting groups: fits, no
	// place, not judged; lastNotJudged is the latest reason for the last.
	answers       map[string]int
	lastNotJudged string
}

// longestWait says how long a pod waited at most while its group fitted.
func (c *checker) longestWait() string {
	if c.longestPod == "" {
		return "none"
	}
	return fmt.Sprintf("%s (%s)", c.longest.Round(time.Second), c.longestPod)
}

func newChecker(l limits) *checker {
	return &checker{limits: l, oracle: newOracle(), unconsumedSince: map[types.UID]time.Time{},
		fitsSince: map[string]time.Time{}, clashSince: map[string]time.Time{}, checks: map[int]int{}, answers: map[string]int{}}
}

// check runs invariants 1 to 3 on a view and returns the first breach.
func (c *checker) check(ctx context.Context, v *view) *breach {
	c.checks[invDevices]++
	if what := c.clashes1(v); what != "" {
		return &breach{invariant: invDevices, at: v.at, what: what}
	}
	c.checks[invConsumer]++
	if what := c.unconsumedClaims(v); what != "" {
		return &breach{invariant: invConsumer, at: v.at, what: what}
	}
	c.checks[invWaiting]++
	if what := c.waitingPods(ctx, v); what != "" {
		return &breach{invariant: invWaiting, at: v.at, what: what}
	}
	return nil
}

// ---- invariant 1 ----

// holding is one allocation result that takes a device, of one claim.
type holding struct {
	claim  *resourcev1.ResourceClaim
	result resourcev1.DeviceRequestAllocationResult
}

func (h holding) String() string {
	s := fmt.Sprintf("claim %s (uid %s, created %s, allocated by %s, request %s",
		key(h.claim.Namespace, h.claim.Name), h.claim.UID, h.claim.CreationTimestamp.Format("15:04:05"),
		allocatedBy(h.claim), h.result.Request)
	if h.result.ShareID != nil {
		s += fmt.Sprintf(", share %s consuming %s", *h.result.ShareID, quantities(h.result.ConsumedCapacity))
	}
	return s + ", reserved for " + consumers(h.claim) + ")"
}

// doubleAllocations describes every device that allocated claims hold
// beyond what the API allows, or returns "". Admin access holds nothing.
// A device published with allowMultipleAllocations may hold several
// shares (results with a shareID), as long as what they consume together
// stays within its capacity; no device may be held whole twice, or whole
// and in shares at once.
func doubleAllocations(v *view) string {
	var out []string
	for _, c := range deviceClashes(v) {
		out = append(out, c.what)
	}
	return strings.Join(out, "\n")
}

// clash is one device held beyond what it allows.
type clash struct {
	key  string // the device and its holders' claims
	what string
	// bound: every holder's claim has a bound consumer, so two pods may
	// use the device at once.
	bound bool
}

// clashes1 judges invariant 1 on a view: a clash whose holders are all
// bound breaches at once; another breaches once it has lasted longer
// than limits.clash in the views that showed it.
func (c *checker) clashes1(v *view) string {
	seen := map[string]bool{}
	var out []string
	for _, cl := range deviceClashes(v) {
		seen[cl.key] = true
		first, ok := c.clashSince[cl.key]
		if !ok {
			first = v.at
			c.clashSince[cl.key] = first
			c.clashes++
		}
		switch {
		case cl.bound:
			out = append(out, cl.what+"\n  (every holder's claim has a bound consumer)")
		case v.at.Sub(first) >= c.limits.clash:
			out = append(out, fmt.Sprintf("%s\n  (for %s, longer than the %s the controller has to take its claim back)", cl.what, v.at.Sub(first).Round(time.Millisecond), c.limits.clash))
		}
	}
	for k := range c.clashSince {
		if !seen[k] {
			delete(c.clashSince, k)
			c.repaired++
		}
	}
	return strings.Join(out, "\n")
}

// deviceClashes lists the devices allocated claims hold beyond what the
// API allows (doubleAllocations).
func deviceClashes(v *view) []clash {
	bound := map[types.UID]bool{}
	for i := range v.pods {
		if v.pods[i].Spec.NodeName != "" {
			bound[v.pods[i].UID] = true
		}
	}
	hasBound := func(cl *resourcev1.ResourceClaim) bool {
		for _, r := range cl.Status.ReservedFor {
			if bound[r.UID] {
				return true
			}
		}
		return false
	}
	byDevice := map[string][]holding{}
	for i := range v.claims {
		cl := &v.claims[i]
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := r.Driver + "/" + r.Pool + "/" + r.Device
			byDevice[id] = append(byDevice[id], holding{claim: cl, result: r})
		}
	}
	devices := publishedDevices(v.slices)
	var out []clash
	for _, id := range sortedKeys(byDevice) {
		hs := byDevice[id]
		var whole, shares []holding
		for _, h := range hs {
			if h.result.ShareID == nil {
				whole = append(whole, h)
			} else {
				shares = append(shares, h)
			}
		}
		var problem string
		switch {
		case len(whole) > 1:
			problem = fmt.Sprintf("held whole by %d claims", len(whole))
		case len(whole) == 1 && len(shares) > 0:
			problem = fmt.Sprintf("held whole by one claim and in %d shares", len(shares))
		case len(shares) > 0:
			problem = shareProblem(devices[id], shares)
		}
		if problem == "" {
			continue
		}
		lines := []string{fmt.Sprintf("device %s is %s:", id, problem)}
		key := id
		allBound := true
		for _, h := range hs {
			lines = append(lines, "  "+h.String())
			key += "|" + string(h.claim.UID)
			allBound = allBound && hasBound(h.claim)
		}
		out = append(out, clash{key: key, what: strings.Join(lines, "\n"), bound: allBound})
	}
	return out
}

// shareProblem says what is wrong with shares of one device: the device
// does not allow several allocations, or they consume more than it has.
// An unpublished device (its node's slices gone) is not judged.
func shareProblem(dev *resourcev1.Device, shares []holding) string {
	if dev == nil {
		return ""
	}
	if dev.AllowMultipleAllocations == nil || !*dev.AllowMultipleAllocations {
		return fmt.Sprintf("in %d shares but not published with allowMultipleAllocations", len(shares))
	}
	seen := map[types.UID]bool{}
	sum := map[resourcev1.QualifiedName]*resource.Quantity{}
	for _, h := range shares {
		if seen[*h.result.ShareID] {
			return fmt.Sprintf("in two shares with the same shareID %s", *h.result.ShareID)
		}
		seen[*h.result.ShareID] = true
		for name, q := range h.result.ConsumedCapacity {
			if sum[name] == nil {
				sum[name] = resource.NewQuantity(0, q.Format)
			}
			sum[name].Add(q)
		}
	}
	var over []string
	for _, name := range sortedKeys(sum) {
		capacity, ok := dev.Capacity[name]
		if ok && sum[name].Cmp(capacity.Value) > 0 {
			over = append(over, fmt.Sprintf("%s %s of %s", name, sum[name], capacity.Value.String()))
		}
	}
	if len(over) > 0 {
		return fmt.Sprintf("in %d shares that consume more than it has (%s)", len(shares), strings.Join(over, ", "))
	}
	return ""
}

// publishedDevices maps driver/pool/device to the device its slices
// publish.
func publishedDevices(slices []resourcev1.ResourceSlice) map[string]*resourcev1.Device {
	out := map[string]*resourcev1.Device{}
	for i := range slices {
		s := &slices[i]
		for j := range s.Spec.Devices {
			out[s.Spec.Driver+"/"+s.Spec.Pool.Name+"/"+s.Spec.Devices[j].Name] = &s.Spec.Devices[j]
		}
	}
	return out
}

// ---- invariant 2 ----

// unconsumedClaims describes the claims that have been allocated without
// a live consumer for longer than the limit, or returns "". A consumer is
// live while a pod of its name and UID exists and has not finished; a
// consumer that is not a pod counts as live.
func (c *checker) unconsumedClaims(v *view) string {
	pods := map[types.UID]*corev1.Pod{}
	for i := range v.pods {
		pods[v.pods[i].UID] = &v.pods[i]
	}
	seen := map[types.UID]bool{}
	var out []string
	for i := range v.claims {
		cl := &v.claims[i]
		if cl.Status.Allocation == nil || liveConsumer(cl, pods) {
			continue
		}
		seen[cl.UID] = true
		since, ok := c.unconsumedSince[cl.UID]
		if !ok {
			since = v.at
			c.unconsumedSince[cl.UID] = since
		}
		if v.at.Sub(since) > c.limits.unconsumed {
			out = append(out, fmt.Sprintf("claim %s (uid %s, created %s, allocated by %s, deleting: %v) has been allocated without a live consumer since %s (%s, more than %s): reserved for %s; allocation: %s",
				key(cl.Namespace, cl.Name), cl.UID, cl.CreationTimestamp.Format("15:04:05"), allocatedBy(cl), cl.DeletionTimestamp != nil,
				since.Format("15:04:05.000"), v.at.Sub(since).Round(time.Second), c.limits.unconsumed,
				consumerStates(cl, pods), allocationString(cl.Status.Allocation)))
		}
	}
	for uid := range c.unconsumedSince {
		if !seen[uid] {
			delete(c.unconsumedSince, uid)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func liveConsumer(cl *resourcev1.ResourceClaim, pods map[types.UID]*corev1.Pod) bool {
	for _, r := range cl.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			return true
		}
		if p, ok := pods[r.UID]; ok && !finished(p) {
			return true
		}
	}
	return false
}

// consumerStates says what became of each consumer a claim names.
func consumerStates(cl *resourcev1.ResourceClaim, pods map[types.UID]*corev1.Pod) string {
	if len(cl.Status.ReservedFor) == 0 {
		return "nobody"
	}
	var out []string
	for _, r := range cl.Status.ReservedFor {
		state := "gone"
		if p, ok := pods[r.UID]; ok {
			state = "phase " + string(p.Status.Phase)
		}
		out = append(out, fmt.Sprintf("%s %s (uid %s, %s)", r.Resource, r.Name, r.UID, state))
	}
	return strings.Join(out, ", ")
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// ---- invariant 3 ----

// waitingPods describes the opted-in pods that have waited unbound longer
// than the limit while the planner, asked on every view since, found
// their group a place; or returns "". A group the planner cannot judge
// (incomplete: pods or claims missing, its Job gone) restarts its clock.
func (c *checker) waitingPods(ctx context.Context, v *view) string {
	groups := pendingGroups(v)
	var out []string
	for _, g := range groups {
		ans := c.oracle.fits(ctx, v, g)
		switch {
		case ans.fits:
			c.answers["fits"]++
		case strings.HasPrefix(ans.plan, "no place"):
			c.answers["no place"]++
		default:
			c.answers["not judged"]++
			c.lastNotJudged = g.key + ": " + ans.plan
		}
		if !ans.fits {
			delete(c.fitsSince, g.key)
			continue
		}
		since, ok := c.fitsSince[g.key]
		if !ok {
			since = v.at
			c.fitsSince[g.key] = since
		}
		limit, why := c.limits.waiting, ""
		if g.reservedElsewhere() {
			limit += c.limits.reserved
			why = ", a reservation elsewhere included"
		}
		for _, p := range g.pending {
			from := later(p.CreationTimestamp.Time, since)
			if w := v.at.Sub(from); w > c.longest {
				c.longest, c.longestPod = w, key(p.Namespace, p.Name)
			}
			if v.at.Sub(from) <= limit {
				continue
			}
			out = append(out, fmt.Sprintf("pod %s (uid %s, created %s, gated: %v, %s) of group %s has waited unbound %s (more than %s%s) while the planner found its group a place in every check since %s.\n  planner's answer now: %s\n  group: %s",
				key(p.Namespace, p.Name), p.UID, p.CreationTimestamp.Format("15:04:05"), gated(p), podDecision(p),
				g.key, v.at.Sub(from).Round(time.Second), limit, why,
				since.Format("15:04:05.000"), ans.plan, g.describe(v)))
		}
	}
	for k := range c.fitsSince {
		if !slices.ContainsFunc(groups, func(g *group) bool { return g.key == k }) {
			delete(c.fitsSince, k)
		}
	}
	return strings.Join(out, "\n")
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func gated(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == placementapi.SchedulingGate })
}

// podDecision is what the controller wrote on the pod.
func podDecision(p *corev1.Pod) string {
	var parts []string
	for _, k := range []string{placementapi.AnnotationStatus, placementapi.AnnotationDomain, placementapi.AnnotationNode, placementapi.AnnotationReleased} {
		if v, ok := p.Annotations[k]; ok {
			parts = append(parts, fmt.Sprintf("%s=%q", k, v))
		}
	}
	if len(parts) == 0 {
		return "no decision written"
	}
	return strings.Join(parts, " ")
}

// ---- invariant 4 ----

// allocatedClaims describes every allocated claim, or returns "".
func allocatedClaims(v *view) string {
	var out []string
	for i := range v.claims {
		cl := &v.claims[i]
		if cl.Status.Allocation != nil {
			out = append(out, fmt.Sprintf("claim %s (uid %s, created %s, allocated by %s, deleting: %v) reserved for %s; allocation: %s",
				key(cl.Namespace, cl.Name), cl.UID, cl.CreationTimestamp.Format("15:04:05"), allocatedBy(cl), cl.DeletionTimestamp != nil,
				consumers(cl), allocationString(cl.Status.Allocation)))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// ---- formatting ----

func key(ns, name string) string { return ns + "/" + name }

func allocatedBy(cl *resourcev1.ResourceClaim) string {
	if by := cl.Annotations[placementapi.AnnotationAllocatedBy]; by != "" {
		return "gputopo for " + by
	}
	return "the scheduler"
}

func consumers(cl *resourcev1.ResourceClaim) string {
	if len(cl.Status.ReservedFor) == 0 {
		return "nobody"
	}
	var out []string
	for _, r := range cl.Status.ReservedFor {
		out = append(out, fmt.Sprintf("%s %s (uid %s)", r.Resource, r.Name, r.UID))
	}
	return strings.Join(out, ", ")
}

// allocationString lists an allocation's devices and its node.
func allocationString(a *resourcev1.AllocationResult) string {
	var devs []string
	for _, r := range a.Devices.Results {
		d := r.Pool + "/" + r.Device
		if r.ShareID != nil {
			d += fmt.Sprintf(" (share %s: %s)", *r.ShareID, quantities(r.ConsumedCapacity))
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			d += " (admin access)"
		}
		devs = append(devs, d)
	}
	s := "[" + strings.Join(devs, ", ") + "]"
	if a.NodeSelector != nil {
		s += " on " + selectorString(a.NodeSelector)
	}
	if a.AllocationTimestamp != nil {
		s += " at " + a.AllocationTimestamp.Format("15:04:05")
	}
	return s
}

func selectorString(sel *corev1.NodeSelector) string {
	var terms []string
	for _, t := range sel.NodeSelectorTerms {
		var reqs []string
		for _, r := range append(slices.Clone(t.MatchFields), t.MatchExpressions...) {
			reqs = append(reqs, fmt.Sprintf("%s %s %v", r.Key, r.Operator, r.Values))
		}
		terms = append(terms, strings.Join(reqs, " and "))
	}
	return strings.Join(terms, " or ")
}

func quantities(m map[resourcev1.QualifiedName]resource.Quantity) string {
	var out []string
	for _, k := range sortedKeys(m) {
		q := m[k]
		out = append(out, fmt.Sprintf("%s=%s", k, q.String()))
	}
	return strings.Join(out, " ")
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
