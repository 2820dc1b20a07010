package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// A sync is observe → decide → act:
//   - observe (sync.go) reads the group from the informers, and what the
//     decision needs to know of each member from the claim index, the node
//     lister and the controller's memory, into an observation;
//   - decide, here, is a pure function of the observation: which pods give
//     their claims back or are deleted, which events are due, and what the
//     group does next (wait with a status, open its gates, or be planned);
//   - act (sync.go) makes the writes, then plans the group if the
//     decision says so. The plan is the planner's pure function of the
//     group and the snapshot, written by allocate.

// observation is what one sync knows of a group.
type observation struct {
	g *group
	// req is the group's placement request, or reqErr why it is invalid.
	req    placement.Request
	reqErr error
	facts  map[*member]facts
	// gatesIn is how long the gates of a placed group stay closed yet; 0
	// once they may open.
	gatesIn time.Duration
	// unseen names a held claim the claim index does not show yet at the
	// version the controller wrote, or a held pod whose gate this process
	// opened and the informer shows closed yet; nothing is done until the
	// object's event requeues the group.
	unseen string
}

// facts is what observe found about one member beyond its pod and claims.
type facts struct {
	// clash says which other claim holds a device of the pod's claims too;
	// others lists the pods those claims are reserved for.
	clash  string
	others []*v1.Pod
	// releasable: every allocation the controller made for the pod may be
	// taken back (every pod it is reserved for is still behind the gate).
	releasable bool
	// stuck says why a steered or held pod cannot bind where its claims
	// are (a Release* reason), with a detail for the message; for a held
	// pod only its node's state counts.
	stuck, stuckDetail string
	// nodeGone: a bound pod's node is deleted.
	nodeGone bool
}

// started reports whether the pod runs: its devices are prepared and in
// use.
func started(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning }

// replaceable reports whether a workload controller replaces the pod when
// it is deleted.
func replaceable(p *v1.Pod) bool { return metav1.GetControllerOf(p) != nil }

type actionKind int

const (
	// actRelease takes back the member's claims, says why on the pod, and
	// plans it again.
	actRelease actionKind = iota
	// actRestart takes back the member's claims without a note: its group
	// is planned again as a whole.
	actRestart
	// actDelete deletes the pod with an event; its workload replaces it.
	actDelete
	// actNodeLost reports, once, a bound pod whose node is deleted.
	actNodeLost
	// actNotBound reports a steered pod the scheduler has not bound where
	// its claims are, and looks again after the bind timeout.
	actNotBound
	// actMoved records a bound pod the scheduler put on another node of
	// its domain than the planned one.
	actMoved
)

// action is one thing the sync does to one pod.
type action struct {
	kind   actionKind
	pod    *v1.Pod
	m      *member // the group's member, for actRelease and actRestart
	reason string
	detail string
}

type next int

const (
	// nextForget: the group is gone; forget what is remembered of it.
	nextForget next = iota
	// nextNothing: wait for an event that requeues the group.
	nextNothing
	// nextSettled: every pod of the group is placed or on its way.
	nextSettled
	// nextRefuse: the group cannot be placed as it is; say why.
	nextRefuse
	// nextStatus: the group waits for something outside the controller;
	// say what on its waiting pods.
	nextStatus
	// nextOpenGates: the group's claims are written and seen; open the
	// gates of its held pods.
	nextOpenGates
	// nextWaitGates: the gates open after gatesIn.
	nextWaitGates
	// nextPlan: plan the group's pods that need a place.
	nextPlan
)

// decision is what decide tells act to do.
type decision struct {
	// g is the group with its members where the actions leave them.
	g       *group
	actions []action
	next    next
	// fresh: none of the group's pods runs or is on its way; it is planned
	// as a whole.
	fresh bool
	// For nextRefuse and nextStatus: the metric outcome ("" for none), the
	// reason and message, the pods that get the status, and what the
	// worker does with the key.
	outcome, reason, message string
	pods                     []*v1.Pod
	res                      result
	// requeue: sync the group again after this long (0: no need).
	requeue time.Duration
}

// decide is the sync's decision; it reads only the observation.
func decide(o *observation, bindTimeout time.Duration) decision {
	g := o.g.clone()
	d := decision{g: g, res: done}
	switch {
	case g.gone || g.members() == 0:
		d.next = nextForget
		return d
	case g.lagging:
		// The claim's event requeues the group.
		d.next = nextNothing
		return d
	case o.reqErr != nil:
		d.next, d.outcome, d.reason, d.message = nextRefuse, OutcomeInvalid, ReasonInvalidPlacement, o.reqErr.Error()
		d.pods = append(g.pods(g.toPlace), g.gatedWaiting()...)
		return d
	case g.pgErr != nil:
		d.next, d.outcome, d.reason, d.message = nextRefuse, OutcomeInvalid, ReasonInvalidPlacement, g.pgErr.Error()
		d.pods = append(g.pods(g.toPlace), g.gatedWaiting()...)
		return d
	case g.broken != nil:
		d.next, d.outcome, d.reason, d.message, d.res = nextRefuse, OutcomeInvalid, ReasonInvalidClaim, g.broken.Error(), backoff
		d.pods = append(g.pods(g.toPlace), g.gatedWaiting()...)
		return d
	}

	// Clashes first: a device in two claims.
	g.held = d.clashes(o, g.held)
	g.steered = d.clashes(o, g.steered)
	g.bound = d.clashes(o, g.bound)
	d.recover(o, bindTimeout)
	for _, m := range g.foreign {
		if m.holdsOwn() {
			d.actions = append(d.actions, action{kind: actRelease, pod: m.pod, m: m, reason: ReleaseForeignGate, detail: g.foreignMessage()})
		}
	}

	if len(g.toPlace) == 0 {
		switch {
		case len(g.foreign) > 0:
			d.status(placement.StatusWaitingForGates, g.foreignMessage(), g.pods(g.foreign), "")
		case len(g.waiting) > 0:
			d.status(placement.StatusWaitingForPods, placement.WaitingForPodsMessage, g.gatedWaiting(), "")
		case len(g.held) == 0:
			d.next = nextSettled
		case o.gatesIn > 0:
			d.next = nextWaitGates
		case o.unseen != "":
			// The claim's event requeues the group.
			d.next = nextNothing
		default:
			d.next = nextOpenGates
		}
		return d
	}

	if o.unseen != "" {
		// A gate this process opened, or a claim it wrote, is not in the
		// informer yet: planning now would take back and plan again pods
		// on their way to the scheduler. The event requeues the group.
		d.next = nextNothing
		return d
	}

	// A group none of whose pods runs yet is planned as a whole. Claims an
	// interrupted earlier attempt allocated are taken back first, so the
	// plan is all or nothing.
	d.fresh = len(g.bound) == 0 && len(g.steered) == 0
	if d.fresh {
		waiting := append(g.pods(g.toPlace), g.pods(g.held)...)
		switch {
		case len(g.foreign) > 0:
			d.status(placement.StatusWaitingForGates, g.foreignMessage(), append(g.pods(g.foreign), waiting...), OutcomeWaiting)
			return d
		case g.pgMissing:
			d.status(placement.StatusWaitingForPodGroup, fmt.Sprintf("waiting for PodGroup %s, which the pods name in spec.schedulingGroup: its gang size and topology constraint are part of the plan", g.podGroupName), waiting, OutcomeWaiting)
			return d
		case g.members()+g.dueCount() < g.size || len(g.waiting) > 0:
			d.status(placement.StatusWaitingForPods, placement.WaitingForPodsMessage, waiting, OutcomeWaiting)
			return d
		}
		for _, m := range g.held {
			d.actions = append(d.actions, action{kind: actRestart, pod: m.pod, m: m})
		}
		// Claims the controller allocated for these pods under another
		// group (the pods were orphaned by their Job, or their group
		// annotation changed) are taken back too.
		for _, m := range g.toPlace {
			if m.holdsOwn() && !d.releases(m) {
				d.actions = append(d.actions, action{kind: actRestart, pod: m.pod, m: m})
			}
		}
		g.toPlace = append(g.held, g.toPlace...)
		g.held = nil
		rankMembers(g.toPlace)
	}
	if why := volumeWait(g.toPlace); why != "" {
		// kube-scheduler leaves the pod pending until its volumes can be
		// bound; the claims' and volumes' events requeue the group.
		d.status(placement.StatusWaitingForVolumes, why, append(g.pods(g.toPlace), g.gatedWaiting()...), OutcomeWaiting)
		return d
	}
	d.next = nextPlan
	return d
}

// volumeWait says why a pod of ms can go to no node for its volumes now,
// "" when none waits for them.
func volumeWait(ms []*member) string {
	for _, m := range ms {
		if m.volumeWait != "" {
			return fmt.Sprintf("pod %s: %s", m.pod.Name, m.volumeWait)
		}
	}
	return ""
}

// releases reports whether an action already takes back the member's
// claims.
func (d *decision) releases(m *member) bool {
	return slices.ContainsFunc(d.actions, func(a action) bool { return a.m == m && (a.kind == actRelease || a.kind == actRestart) })
}

func (d *decision) status(reason, message string, pods []*v1.Pod, outcome string) {
	d.next, d.reason, d.message, d.pods, d.outcome = nextStatus, reason, message, pods, outcome
}

// clashes decides for the members of one list whose claims share a device
// with another claim, and returns those that stay in the list. The pod
// that has not started gives way: the controller may have written a
// device the scheduler was allocating in memory, or the reverse, and the
// kubelet plugin prepares a device for one claim at a time, so the second
// pod could never start while the first runs.
//   - A pod not started whose claims the controller may take back gives
//     them back and is planned again.
//   - A pod not started whose claims only the scheduler changes now (its
//     gate is open) is deleted when a workload replaces it.
//   - A started pod keeps its devices; the other claims' pods that have
//     not started and that a workload replaces are deleted.
func (d *decision) clashes(o *observation, ms []*member) []*member {
	var keep []*member
	for _, m := range ms {
		f := o.facts[m]
		if f.clash == "" {
			keep = append(keep, m)
			continue
		}
		switch {
		case !started(m.pod) && f.releasable && m.holdsOwn() && m.pod.Spec.NodeName == "":
			d.actions = append(d.actions, action{kind: actRelease, pod: m.pod, m: m, reason: ReleaseConflict, detail: f.clash})
			d.g.toPlace = append(d.g.toPlace, m)
			continue
		case !started(m.pod) && !hasGate(m.pod) && replaceable(m.pod):
			d.actions = append(d.actions, action{kind: actDelete, pod: m.pod, detail: f.clash + "; the pod has not started, so it gives way: deleting it so its workload replaces it"})
			continue
		case started(m.pod):
			for _, p := range f.others {
				if !started(p) && replaceable(p) {
					d.actions = append(d.actions, action{kind: actDelete, pod: p, detail: fmt.Sprintf("%s; pod %s runs with it, so this pod, not started, gives way: deleting it so its workload replaces it", f.clash, m.pod.Name)})
				}
			}
		}
		keep = append(keep, m)
	}
	return keep
}

// recover decides for pods that can no longer bind where their claims
// are: their node is gone, NotReady or tainted against them, or they were
// not bound within the bind timeout. A steered pod whose claims the
// controller may take back is planned again; otherwise the scheduler
// takes them back itself (its PostFilter), or moves the pod within its
// domain affinity, and the group is looked at again after the bind
// timeout. Bound pods whose node is deleted are left to the pod garbage
// collector; they pin nothing meanwhile.
func (d *decision) recover(o *observation, bindTimeout time.Duration) {
	g := d.g
	var keep []*member
	for _, m := range g.steered {
		f := o.facts[m]
		switch {
		case f.stuck == "":
			keep = append(keep, m)
		case f.releasable && m.holdsOwn():
			d.actions = append(d.actions, action{kind: actRelease, pod: m.pod, m: m, reason: f.stuck, detail: f.stuckDetail})
			g.toPlace = append(g.toPlace, m)
		default:
			d.actions = append(d.actions, action{kind: actNotBound, pod: m.pod, reason: f.stuck, detail: f.stuckDetail})
			d.requeue = bindTimeout
			keep = append(keep, m)
		}
	}
	g.steered = keep
	// A gated pod whose node failed before its gate opened is planned
	// again rather than sent to a node it cannot bind to.
	keep = nil
	for _, m := range g.held {
		if f := o.facts[m]; f.stuck != "" && f.releasable {
			d.actions = append(d.actions, action{kind: actRelease, pod: m.pod, m: m, reason: f.stuck, detail: f.stuckDetail})
			g.toPlace = append(g.toPlace, m)
			continue
		}
		keep = append(keep, m)
	}
	g.held = keep
	keep = nil
	for _, m := range g.bound {
		if o.facts[m].nodeGone {
			d.actions = append(d.actions, action{kind: actNodeLost, pod: m.pod, detail: m.node})
			continue
		}
		keep = append(keep, m)
		if planned := m.pod.Annotations[placement.AnnotationNode]; planned != "" && planned != m.pod.Spec.NodeName {
			d.actions = append(d.actions, action{kind: actMoved, pod: m.pod, detail: planned})
		}
	}
	g.bound = keep
	rankMembers(g.toPlace)
}

// unpin decides, for a group whose domain cannot hold its new pods around
// those that keep their places, which gated pods move: those whose
// claims the controller may take back are planned again with the pods
// that need a place. It returns the actions and the group as they leave
// it, or no actions when none may move.
func unpin(o *observation, g *group) ([]action, *group) {
	g = g.clone()
	var keep, moved []*member
	for _, m := range g.held {
		if o.facts[m].releasable {
			moved = append(moved, m)
		} else {
			keep = append(keep, m)
		}
	}
	if len(moved) == 0 {
		return nil, g
	}
	var acts []action
	for _, m := range moved {
		acts = append(acts, action{kind: actRelease, pod: m.pod, m: m, reason: ReleaseDomainFull,
			detail: "the group's domain cannot hold its pods that need a place; planning the pods that have not started again with them"})
	}
	g.held = keep
	g.toPlace = append(g.toPlace, moved...)
	rankMembers(g.toPlace)
	return acts, g
}

// clone copies the group with lists of its own, so a decision can move
// members between them.
func (g *group) clone() *group {
	c := *g
	c.bound, c.steered, c.held = slices.Clone(g.bound), slices.Clone(g.steered), slices.Clone(g.held)
	c.toPlace, c.waiting, c.foreign = slices.Clone(g.toPlace), slices.Clone(g.waiting), slices.Clone(g.foreign)
	return &c
}

// foreignMessage says which other gates hold the group's pods.
func (g *group) foreignMessage() string {
	seen := map[string]bool{}
	var gates []string
	for _, m := range g.foreign {
		for _, name := range foreignGates(m.pod) {
			if !seen[name] {
				seen[name] = true
				gates = append(gates, name)
			}
		}
	}
	return fmt.Sprintf("%d of the group's pods are held by scheduling gate %s of another controller; gputopo plans the group once its own gate %s is the last one",
		len(g.foreign), strings.Join(gates, ", "), placement.SchedulingGate)
}
