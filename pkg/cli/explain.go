package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// Explanation is what the controller decided for a group of pods and why,
// and what each pod's claims got.
type Explanation struct {
	TypeMeta
	// Group is namespace/name of the Job, JobSet, gputopo.dev/group or pod.
	Group string `json:"group"`
	// GroupKind says which of them Group is.
	GroupKind placement.GroupKind `json:"groupKind,omitempty"`
	Domains   []string            `json:"domains,omitempty"`
	Pods      []PodPlan           `json:"pods"`
	Decisions []Decision          `json:"decisions,omitempty"`
}

// PodPlan is one pod of the group.
type PodPlan struct {
	Name string `json:"name"`
	// State is placed (bound to a node), starting (bound, not running
	// yet), waiting (gated) (a scheduling gate holds it) or pending (the
	// scheduler has not placed it).
	State string `json:"state"`
	Node  string `json:"node,omitempty"`
	// Why the pod still waits: the controller's status for a pod its gate
	// holds, the other gates that hold it, what keeps a bound pod from
	// starting, or the scheduler's message.
	Why string `json:"why,omitempty"`
	// Problems say what is wrong with a pod that waits and what to do,
	// found from its claims, events and the cluster's devices.
	Problems []string `json:"problems,omitempty"`
	// Released says how often the controller took the pod's claims back
	// to plan it again, and why the last time (gputopo.dev/released).
	Released string      `json:"released,omitempty"`
	Claims   []ClaimPlan `json:"claims,omitempty"`
}

// ClaimPlan is what one request of a pod's claim was allocated.
type ClaimPlan struct {
	Claim   string `json:"claim"`
	Request string `json:"request"`
	// Rung is the subrequest of a firstAvailable request that the
	// allocator picked, RungIndex its place (1 is the first choice) among
	// Rungs; empty and 0 for a plain request.
	Rung      string   `json:"rung,omitempty"`
	RungIndex int      `json:"rungIndex,omitempty"`
	Rungs     int      `json:"rungs,omitempty"`
	Node      string   `json:"node,omitempty"`
	Devices   []string `json:"devices"`
}

// Decision is one of the controller's events about the group.
type Decision struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
}

// Pod states.
const (
	StatePlaced   = "placed"
	StateStarting = "starting"
	StateGated    = "waiting (gated)"
	StatePending  = "pending"
)

// BuildExplanation reads the controller's annotations on the pods, the
// allocation of their claims and the controller's events.
func BuildExplanation(group string, pods []v1.Pod, claims []resourceapi.ResourceClaim, events []v1.Event) Explanation {
	return BuildExplanationIn(context.Background(), group, pods, claims, events, nil)
}

// BuildExplanationIn is BuildExplanation that also says why pods wait
// that no gputopo gate holds, or whose claims are missing, from the
// cluster's state cs (nil: only from the pods' events).
func BuildExplanationIn(ctx context.Context, group string, pods []v1.Pod, claims []resourceapi.ResourceClaim, events []v1.Event, cs *ClusterState) Explanation {
	e := Explanation{Group: group, Pods: []PodPlan{}}
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, c v1.Pod) int { return natCmp(a.Name, c.Name) })
	byName := map[string]*resourceapi.ResourceClaim{}
	for i := range claims {
		byName[claims[i].Name] = &claims[i]
	}
	domains := map[string]bool{}
	for _, p := range pods {
		pp := PodPlan{Name: p.Name, State: StatePlaced, Node: p.Spec.NodeName}
		evs := podEvents(events, p.Name)
		explainWait(ctx, &pp, &p, byName, evs, cs)
		if d := p.Annotations[placement.AnnotationDomain]; d != "" {
			domains[d] = true
		}
		if v := p.Annotations[placement.AnnotationReleased]; v != "" {
			if r, err := placement.ParseRelease(v); err == nil {
				pp.Released = fmt.Sprintf("%d× (last: %s)", r.Count, r.Reason)
			} else {
				pp.Released = err.Error()
			}
		}
		for _, name := range podClaimNames(&p) {
			if c := byName[name]; c != nil {
				pp.Claims = append(pp.Claims, claimPlans(c)...)
			}
		}
		e.Pods = append(e.Pods, pp)
	}
	e.Domains = slices.Sorted(maps.Keys(domains))
	slices.SortFunc(events, func(a, c v1.Event) int { return a.LastTimestamp.Compare(c.LastTimestamp.Time) })
	for _, ev := range events {
		if ev.Source.Component != "gputopo-controller" && ev.ReportingController != "gputopo-controller" {
			continue
		}
		e.Decisions = append(e.Decisions, Decision{Time: ev.LastTimestamp.Time, Type: ev.Type, Reason: ev.Reason, Message: ev.Message})
	}
	return e
}

// podClaimNames lists the pod's ResourceClaims: those it names and those
// made for it from templates.
// explainWait fills in why pod p waits, if it does.
func explainWait(ctx context.Context, pp *PodPlan, p *v1.Pod, byName map[string]*resourceapi.ResourceClaim, evs []v1.Event, cs *ClusterState) {
	templates := []resourceapi.ResourceClaimTemplate(nil)
	if cs != nil {
		templates = cs.Templates
	}
	gated := slices.ContainsFunc(p.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == placement.SchedulingGate })
	switch {
	case p.Spec.NodeName != "":
		if p.Status.Phase == v1.PodPending {
			pp.State = StateStarting
			pp.Why = startingWhy(p, evs)
		}
	case gated:
		pp.State = StateGated
		pp.Why = p.Annotations[placement.AnnotationStatus]
		st, err := placement.ParseStatus(pp.Why)
		if err == nil && st.Reason == placement.StatusWaitingForPods && strings.Contains(st.Message, "ResourceClaims") {
			if e := lastEvent(evs, EventFailedResourceClaimCreation); e != nil {
				pp.Why = e.Message
			}
		}
		if cs != nil {
			pp.Problems = missingClaims(p, byName, evs, templates)
			if len(pp.Problems) == 0 {
				pp.Problems, _ = diagnoseClaims(ctx, unallocated(claimsOf(p, byName)), fitCheckFor(cs))
			}
		}
	case len(p.Spec.SchedulingGates) > 0:
		pp.State = StateGated
		gates := otherGates(p)
		pp.Why = fmt.Sprintf("held by the scheduling gates %s: the controller that added them (a queue such as Kueue) removes them when it admits the pod", strings.Join(gates, ", "))
		if cs != nil {
			pp.Problems = missingClaims(p, byName, evs, templates)
		}
	default:
		pp.State = StatePending
		pp.Why = schedulerSays(p, evs)
		if cs != nil {
			pp.Problems = diagnose(ctx, p, byName, evs, cs)
		} else if e := lastEvent(evs, EventFailedResourceClaimCreation); e != nil {
			pp.Problems = []string{e.Message}
		}
	}
}

func podClaimNames(p *v1.Pod) []string {
	var out []string
	for _, c := range p.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			out = append(out, *c.ResourceClaimName)
		}
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out = append(out, *s.ResourceClaimName)
		}
	}
	return out
}

// claimPlans lists what each request of an allocated claim got. The
// allocator names the result of a firstAvailable request
// "<request>/<subrequest>".
func claimPlans(c *resourceapi.ResourceClaim) []ClaimPlan {
	if c.Status.Allocation == nil {
		return nil
	}
	node := allocationNode(c.Status.Allocation)
	var out []ClaimPlan
	index := map[string]int{}
	for _, r := range c.Status.Allocation.Devices.Results {
		req, sub, _ := strings.Cut(r.Request, "/")
		i, ok := index[r.Request]
		if !ok {
			i = len(out)
			index[r.Request] = i
			out = append(out, ClaimPlan{Claim: c.Name, Request: req, Rung: sub, Node: node, Devices: []string{}})
			if sub != "" {
				out[i].RungIndex, out[i].Rungs = rungOf(c, req, sub)
			}
		}
		out[i].Devices = append(out[i].Devices, r.Device)
	}
	return out
}

func rungOf(c *resourceapi.ResourceClaim, req, sub string) (index, of int) {
	for _, r := range c.Spec.Devices.Requests {
		if r.Name != req {
			continue
		}
		for j, s := range r.FirstAvailable {
			if s.Name == sub {
				return j + 1, len(r.FirstAvailable)
			}
		}
	}
	return 0, 0
}

// allocationNode is the node an allocation is bound to, from its node
// selector (metadata.name or kubernetes.io/hostname).
func allocationNode(a *resourceapi.AllocationResult) string {
	if a.NodeSelector == nil {
		return ""
	}
	for _, t := range a.NodeSelector.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
		for _, e := range t.MatchExpressions {
			if e.Key == "kubernetes.io/hostname" && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// RenderExplanation writes an explanation for a person. Wide adds the
// devices of each claim.
func RenderExplanation(w io.Writer, e Explanation, o TreeOptions) error {
	pal := palette(o.Color)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", pal.bold(e.Group), plural(len(e.Pods), "pod"))
	if len(e.Pods) == 0 {
		b.WriteString("  no pods found: is the Job running (kubectl describe job shows why it creates none)?\n")
	}
	for _, p := range e.Pods {
		node := p.Node
		if node == "" {
			node = "-"
		}
		state := p.State
		if state == "placed" {
			state = pal.free(fmt.Sprintf("%-16s", state))
		} else {
			state = pal.allocated(fmt.Sprintf("%-16s", state))
		}
		fmt.Fprintf(&b, "  %-32s %s node=%s\n", p.Name, state, node)
		if p.Why != "" {
			fmt.Fprintf(&b, "      why: %s\n", p.Why)
		}
		for _, pr := range p.Problems {
			fmt.Fprintf(&b, "      %s %s\n", pal.allocated("problem:"), pr)
		}
		if p.Released != "" {
			fmt.Fprintf(&b, "      released and planned again: %s\n", p.Released)
		}
		for _, c := range p.Claims {
			line := "      " + c.Request
			if c.Rung != "" {
				line += fmt.Sprintf(" → %s (%s choice of %d)", c.Rung, ordinal(c.RungIndex), c.Rungs)
			}
			line += fmt.Sprintf(": %d GPUs", len(c.Devices))
			if o.Wide {
				line += " " + pal.dim(strings.Join(c.Devices, ","))
			}
			b.WriteString(line + "\n")
		}
	}
	if len(e.Domains) > 0 {
		fmt.Fprintf(&b, "domain: %s\n", strings.Join(e.Domains, " "))
	}
	if len(e.Decisions) > 0 {
		b.WriteString("decisions:\n")
		for _, d := range e.Decisions {
			fmt.Fprintf(&b, "  %s %s %s: %s\n", d.Time.Format("15:04:05"), d.Type, d.Reason, d.Message)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ordinal(n int) string {
	switch {
	case n <= 0:
		return "unknown"
	case n%100 >= 11 && n%100 <= 13:
		return fmt.Sprintf("%dth", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	}
	return fmt.Sprintf("%dth", n)
}
